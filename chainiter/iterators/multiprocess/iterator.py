"""``MultiprocessIterator``: the wiring of the multiprocess transport.

It turns the iterator's steps (``_base.py``) into batches submitted to the
pool and reads each finished batch back from its slot.  ``__init__.py``
draws the data flow.
"""

import os
from typing import Any, Callable, Dict, Optional, Tuple, Union

from chainiter._cpus import usable_cpus
from chainiter._interrupts import uninterrupted
from chainiter.errors import TimeoutWarning
from chainiter.iterators import order_samplers
from chainiter.iterators._base import DatasetIterator
from chainiter.iterators.multiprocess import group_flow, reading
from chainiter.iterators.multiprocess import depth as _depth
from chainiter.iterators.multiprocess import options as _options
from chainiter.iterators.multiprocess.fitting import Fitting
from chainiter.iterators.multiprocess.groups import Member
from chainiter.iterators.multiprocess.grouping import Grouping
from chainiter.iterators.multiprocess.iterator_stats import IteratorStats
from chainiter.iterators.multiprocess.transport import Transport
from chainiter.iterators.multiprocess.room import descriptor_room


class MultiprocessIterator(IteratorStats, DatasetIterator):
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

    PREFETCH_BYTES = 256 * 2 ** 20
    MAX_PREFETCH_PER_WORKER = 16
    # Small batches go to the workers in groups that load in about this
    # long, of at most MAX_GROUP batches (``grouping.py``).
    GROUP_S = 2e-3
    MAX_GROUP = 32
    GROUP_AFTER = 32       # batches measured first
    # Then measured again over as many batches as this, after as many
    # again; groups may grow once (``Grouping.group_arrived``).
    REGROUP_AFTER = 1024

    TimeoutWarning = TimeoutWarning

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
                 prefetch_bytes: int = PREFETCH_BYTES,
                 shard: Union[Tuple[int, int], str, Any, None] = None,
                 converter_in_workers: bool = False) -> None:
        options = _options.read(
            usable_cpus(), n_processes, n_prefetch, prefetch_bytes,
            shared_mem, dataset_timeout, maxtasksperchild, converter,
            converter_in_workers, start_method, worker_init_fn,
            self.MAX_PREFETCH_PER_WORKER)
        super().__init__(dataset, batch_size, repeat, shuffle, order_sampler,
                         seed, shard)
        _options.check_sent(options, dataset)
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
        self._fitting = Fitting()   # the warnings given
        self._start_transport()
        self._start_pool()
        if self._t.pool.slots.layout is not None:      # from shared_mem
            self._tune_depth(self._t.pool.slots.layout.slot_bytes)
        # Until the first batch has sized the buffers, batches travel
        # through the socket: send only that one, the rest follow it.
        self._dispatch_until(self._t.depth
                             if self._t.pool.slots.layout is not None else 1)

    @property
    def stats(self) -> Dict[str, Any]:
        return self._transport_stats(super().stats)

    def reset_stats(self) -> None:
        self._t.by_copy = 0
        super().reset_stats()

    def _tune_depth(self, slot_bytes):
        """The self-tuning depth, from the size of a batch's slot."""
        group = self._t.groups.size
        depth = _depth.at_least(
            _depth.tuned(self._options, self.batch_size, slot_bytes, group,
                         descriptor_room()),
            self._options.n_prefetch, group)
        if depth != self._t.pool.book.n_jobs_ahead or \
                depth * group != self._t.depth:
            # The pool counts groups, the iterator batches.
            self._t.pool.set_depth(depth, depth * group)
            self._t.depth = depth * group
        # Last: an interrupt before has it tuned again.
        self._t.tuned = True

    def _start_transport(self):
        self._t = Transport(self._options, Grouping(
            self._options.may_group, self.GROUP_S, self.MAX_GROUP,
            self.GROUP_AFTER, self.REGROUP_AFTER))

    @property
    def _prefetch_depth(self):
        return self._t.depth

    def _start_pool(self):
        self._t.start_pool(self, self._options, self._worker_seed)

    @property
    def _worker_seed(self):
        """The seed the workers' global generators and ``WorkerInfo`` get:
        the iterator's, or, sharded, one of ``(seed, rank)``."""
        if self._shard is None:
            return self._seed
        return order_samplers.rank_seed(self._seed, self._shard.rank)

    def _transport_attributes(self):
        return super()._transport_attributes() + ('_t',)

    # ---- transport ----------------------------------------------------------

    def __next__(self):
        self._leave_parents_pool()
        return super().__next__()

    def _leave_parents_pool(self):
        """In a forked child (os.fork(), or a fork Process given the
        iterator) the workers are the parent's: leave them alone, and load
        on from the current state with workers of its own."""
        pool = self._t.pool
        if pool is not None and pool.owner != os.getpid():
            self._t.finalizer.detach()
            self._start_transport()
            self._rewind()

    def _drop_pending(self):
        self._t.groups.drop()
        if self._t.pool is not None:
            self._t.pool.new_generation()
        super()._drop_pending()

    def _interrupted_waiting(self):
        # Waiting in Pool.wait for the batch of the first pending handle,
        # nothing taken: every batch (or group) dispatched is in flight
        # or ready, or was taken ahead and is held by its group
        # (``Groups.work_ahead``).  What the call did before it waited (sent
        # batches, posted groups, tuned the depth) it did whole.
        pool = self._t.pool
        return pool is not None and pool.interrupted_waiting()

    def _collect(self, handle):
        if not self._t.tuned and self._t.pool.slots.layout is not None:
            # A Ctrl-C cut the first batch short after its buffers were
            # made and before the depth was tuned.
            self._tune_depth(self._t.pool.slots.layout.slot_bytes)
        if type(handle) is Member:
            return group_flow.collect_member(self, handle)
        pool = self._t.pool
        batch, chunks, error = reading.wait(pool, handle,
                                            self.dataset_timeout)
        if error is not None:
            raise error
        if self._options.in_workers:
            result, by_copy, slot_bytes = reading.read_converted(
                pool, batch, chunks, self._fitting)
            self._t.by_copy += by_copy
            if slot_bytes is not None:
                self._tune_depth(slot_bytes)
            return result
        stacked, examples, by_copy, slot_bytes, _ = reading.read(
            pool, batch, chunks, self._fitting)
        self._t.by_copy += by_copy
        if slot_bytes is not None:
            self._tune_depth(slot_bytes)
        if stacked is not None:
            grouping = self._t.grouping
            if grouping.groupable:
                self._t.groups.saw(stacked)
                per_batch = grouping.batch_stacked(
                    len(batch.step), self._t.pool.book.meter.sample)
                if per_batch is not None:
                    group_flow.choose_group(self, per_batch)
            return stacked
        return self._convert(examples)

    def _submit(self, step):
        if self._t.pool is None:
            self._start_pool()
        if self._t.groups.size == 1:
            return self._t.pool.submit(step, self._pass_seed)
        return self._t.groups.add(self._t.pool, step, self._pass_seed,
                                  self._options.padding is not None)

    def _convert(self, examples):
        if self._options.converter is not None:
            return self._options.converter(examples)
        return examples

    def finalize(self) -> None:
        # Whole or not at all: a Ctrl-C comes once the pool is closed.
        with uninterrupted():
            self._leave_parents_pool()     # nothing of the parent's to end
            super().finalize()
            if self._t.finalizer is not None:
                self._t.finalizer()
