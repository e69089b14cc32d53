"""``MultiprocessIterator``: the pipeline (``pipeline/iterator.py``) with
worker processes."""

import multiprocessing
from typing import Any, Callable, Optional, Tuple, Union

from chainiter._cpus import usable_cpus
from chainiter.iterators.pipeline import options as _options
from chainiter.iterators.pipeline.iterator import Pipeline
from chainiter.iterators.pipeline.processes import boundary, checks


class MultiprocessIterator(Pipeline):
    """Loads examples in worker processes, through shared memory.

    Args:
        dataset, batch_size, repeat, shuffle, order_sampler, seed, shard:
            as for ``SerialIterator``; the batches are the same.
        n_processes (int or None): worker processes (None: the CPUs this
            process may use: its affinity, within a cgroup CPU quota).
        n_prefetch (int or None): batches in flight ahead of the one
            handed out; each holds a slot of shared memory.  None (the
            default) sizes it from the first batch: 16 per worker for small
            batches (the processes then rarely wait on each other), fewer
            as far as ``prefetch_bytes`` requires, never fewer than 2 per
            worker (as DataLoader), or per CPU when there are more workers
            than CPUs (they share each batch in chunks, and enough batches
            go that every worker has one; not with
            ``converter_in_workers`` or ``maxtasksperchild``), unless the limit
            of open files (``ulimit -n``) leaves room for fewer slots (each
            takes two descriptors; it takes half of what is left).
            An integer is a floor: at least that many batches in flight
            (a group's all counted), deeper where ``prefetch_bytes``
            holds more, as with None.  ``stats['prefetch']`` tells the
            depth.
        prefetch_bytes (int): the shared memory the self-tuning depth may
            use for its slots (the depth + 2: the batch the user holds and
            the one being handed out); default 256 MiB.
        shared_mem (int or None): bytes of shared memory per example for
            its arrays, as Chainer counts them (None: measured from the
            first batch; stacked labels take their rows on top).  Larger
            examples are still delivered, with a ``SharedMemoryWarning``,
            and the buffers grow.  When the workers stack the batch, the
            shapes are measured from the first batch and ``shared_mem``
            lengthens the padded fields to hold that many bytes.
        dataset_timeout (float or None): warn with ``TimeoutWarning`` when no
            batch arrived for that many seconds.
        maxtasksperchild (int or None): replace a worker after that many
            tasks (a batch, or a chunk of one; a group of small batches
            counts as its batches).
        converter: applied to each batch.  With ``concat_examples`` (or a
            ``functools.partial`` of it with ``padding``) the workers stack the
            batch straight into shared memory and ``next()`` returns it,
            also when shapes or dtypes change from batch to batch (bucketed
            data): a field without padding takes any rows that fit its
            bytes, and the buffers grow to the largest batch seen.  Any
            other converter runs in the main process, unless
            ``converter_in_workers``.
        converter_in_workers (bool): run the converter in the workers
            (each batch is then loaded and converted by one worker, and
            at least ``n_processes`` batches are in flight).  The top-level
            ndarrays of its result (a tuple, a dict or a single array) are
            written into shared memory and handed out as views; anything
            else it returns is pickled.  It runs in the workers for every
            batch, those that come by copy too, and never in the main
            process; an exception it raises comes from ``next()`` with
            the worker's traceback.  Under spawn and forkserver it must be
            picklable (checked before any worker starts).  Ignored for
            ``concat_examples``, which the workers run anyway.
        start_method (str or None): ``'fork'``, ``'forkserver'``, ``'spawn'``,
            or None for Python's default.
        worker_init_fn: called as ``worker_init_fn(worker_id)`` in each
            worker when it starts.

    Arrays handed out may view shared memory; they stay valid and unchanged
    for as long as they are referenced.

    ``stats`` is the dict of every iterator (``SerialIterator.stats``) and:
    ``by_copy``, the batches handed out that were not (all) written into
    shared memory by the workers but came through the socket or were
    stacked by the main process (no free slot: batches held by the user
    or a device prefetcher; the first batch, which sizes the buffers; a
    batch with examples larger than any before, which grows them; the
    batches before the buffers could be made (no file descriptor left:
    ``ulimit -n``); a batch whose examples differ among themselves);
    ``prefetch``, the depth in use; ``batches_per_task``, how many
    batches a worker loads as one (small batches of equal structure,
    stacked by ``concat_examples``, go in groups that take a worker about
    ``GROUP_S`` seconds, chosen after ``GROUP_AFTER`` batches and grown
    once if measured again after ``REGROUP_AFTER`` more allows, and
    from then on one by one again once a group fails or its batches differ
    in shape or dtype); ``ready``, batches loaded and waiting
    in order; ``workers_active``, the workers that take tasks now;
    ``worker_busy``, the fraction of the active workers' time spent
    loading (``dataset[i]`` and writing to shared memory, waits for a CPU
    included, as the workers time each chunk) since the timed window began
    (None before), and ``worker_cpu_wait``, the fraction of that time they
    waited for a CPU.
    """

    def __init__(self, dataset: Any, batch_size: int, repeat: bool = True,
                 shuffle: Optional[bool] = None,
                 n_processes: Optional[int] = None,
                 n_prefetch: Optional[int] = None,
                 shared_mem: Optional[int] = None,
                 order_sampler: Optional[Callable[[Any, int], Any]] = None,
                 dataset_timeout: Optional[float] = 30.0,
                 maxtasksperchild: Optional[int] = None, *,
                 seed: Optional[int] = None,
                 converter: Optional[Callable[..., Any]] = None,
                 start_method: Optional[str] = None,
                 worker_init_fn: Optional[Callable[[int], Any]] = None,
                 prefetch_bytes: int = Pipeline.PREFETCH_BYTES,
                 shard: Union[Tuple[int, int], str, Any, None] = None,
                 converter_in_workers: bool = False) -> None:
        options = _options.read(
            usable_cpus(), n_processes, n_prefetch, prefetch_bytes,
            shared_mem, dataset_timeout, maxtasksperchild, converter,
            converter_in_workers, checks.start_method(start_method),
            worker_init_fn, self.MAX_PREFETCH_PER_WORKER)
        super().__init__(dataset, batch_size, repeat, shuffle, order_sampler,
                         seed, shard)
        checks.check_sent(options, dataset)
        self._options = options
        # What Chainer's iterator has as attributes.
        self.n_processes = options.n_processes
        self.n_prefetch = options.n_prefetch
        self.prefetch_bytes = options.prefetch_bytes
        self.shared_mem = options.shared_mem
        self.dataset_timeout = options.dataset_timeout
        self.maxtasksperchild = options.maxtasksperchild
        self.converter = options.converter
        self.worker_init_fn = options.worker_init_fn
        self.converter_in_workers = options.converter_in_workers
        self.start_method = options.start_method
        self._start()

    def _boundary(self):
        return boundary.Processes(
            multiprocessing.get_context(self._options.start_method))
