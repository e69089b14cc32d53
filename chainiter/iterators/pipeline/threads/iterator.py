"""``MultithreadIterator``: the pipeline (``pipeline/iterator.py``) with
worker threads."""

from typing import Any, Callable, Optional, Tuple, Union

from chainiter._cpus import usable_cpus
from chainiter.iterators.pipeline import options as _options
from chainiter.iterators.pipeline.iterator import Pipeline
from chainiter.iterators.pipeline.threads import workers


class MultithreadIterator(Pipeline):
    """Loads examples in ``n_threads`` worker threads, through the pipeline
    of ``MultiprocessIterator``: tasks of a batch (or a chunk of one, or a
    group of small batches), a self-tuned depth, the workers stacking each
    batch into reused buffers, and the batches released in order.  The
    threads write into the process's own memory: no shared-memory file,
    nothing pickled, no receiver thread.  On a free-threaded Python the
    threads load in parallel; with the GIL, what releases it (numpy's
    copies, I/O, decoding in C) does, and a dataset that holds the GIL
    may load faster in the main thread alone: there the iterator measures
    the examples it hands out per second with each (half a second after
    the first batch, then at doubling intervals up to a minute) and lets
    ``next()`` load the batches itself while that is faster
    (``stats['loads_in']``: ``'main thread'``).  Not with an explicit
    ``n_prefetch`` nor a ``worker_init_fn``; ``CHAINITER_THREAD_LOADING``
    (``auto``, ``threads`` or ``main``) decides it instead.

    Args:
        dataset, batch_size, repeat, shuffle, order_sampler, seed, shard:
            as for ``SerialIterator``; the batches are the same.
        n_threads (int): worker threads (Chainer's default: 1).
        n_prefetch (int or None): as for ``MultiprocessIterator``: None
            tunes the depth within ``prefetch_bytes``; an integer N keeps
            at least N batches in flight.
        prefetch_bytes (int): the memory the self-tuning depth may use for
            its buffers.
        converter: as for ``MultiprocessIterator``: with
            ``concat_examples`` (or a ``functools.partial`` of it with
            ``padding``) the threads stack the batch and ``next()``
            returns it; any other converter runs in the calling thread.
        dataset_timeout (float or None): warn with ``TimeoutWarning`` when
            no batch arrived for that many seconds.
        worker_init_fn: called as ``worker_init_fn(worker_id)`` in each
            thread when it starts; ``get_worker_info()`` there (and in
            ``dataset[i]``) describes the thread.  The threads share the
            process's global random generators and leave them as they
            are: ``example_rng()`` gives each example its own.

    ``finalize()`` (or leaving ``with``) stops the threads; a thread inside
    a ``dataset[i]`` that does not return is left to finish it (its
    result is dropped).  ``stats`` has the keys of
    ``MultiprocessIterator.stats``.
    """

    # Chainer's MultithreadIterator keeps its order under '_order', None
    # included.
    _chainer_order = ('_order', True)

    # Where the threads' tasks load, on a build with the GIL
    # (``flow/loading_mode.py``): measured this long after the first
    # batch, over windows of at least this long and this many batches.
    LOADING_FIRST_PROBE_S = 0.5
    LOADING_WINDOW_S = 0.25
    LOADING_WINDOW_BATCHES = 4

    def __init__(self, dataset: Any, batch_size: int, repeat: bool = True,
                 shuffle: Optional[bool] = None, n_threads: int = 1,
                 order_sampler: Optional[Callable[[Any, int], Any]] = None,
                 *, seed: Optional[int] = None,
                 shard: Union[Tuple[int, int], str, Any, None] = None,
                 n_prefetch: Optional[int] = None,
                 prefetch_bytes: int = Pipeline.PREFETCH_BYTES,
                 converter: Optional[Callable[..., Any]] = None,
                 dataset_timeout: Optional[float] = 30.0,
                 worker_init_fn: Optional[Callable[[int], Any]] = None
                 ) -> None:
        options = _options.read(
            usable_cpus(), n_threads, n_prefetch, prefetch_bytes, None,
            dataset_timeout, None, converter, False, 'threads',
            worker_init_fn, self.MAX_PREFETCH_PER_WORKER, workers='n_threads')
        super().__init__(dataset, batch_size, repeat, shuffle, order_sampler,
                         seed, shard)
        self._options = options
        self.n_threads = options.n_processes
        self.n_prefetch = options.n_prefetch
        self.prefetch_bytes = options.prefetch_bytes
        self.dataset_timeout = options.dataset_timeout
        self.converter = options.converter
        self.worker_init_fn = options.worker_init_fn
        self._start()

    def _boundary(self):
        # Not with an explicit n_prefetch (batches loaded ahead), nor with
        # a worker_init_fn (what it sets up may be the thread's own).
        return workers.Threads(may_load_here=(
            self._options.n_prefetch is None and
            self._options.worker_init_fn is None), probe=(
                self.LOADING_FIRST_PROBE_S, self.LOADING_WINDOW_S,
                self.LOADING_WINDOW_BATCHES))
