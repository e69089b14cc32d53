"""``MultiprocessIterator``: the wiring of the multiprocess transport.

It turns the iterator's steps (``_base.py``) into batches submitted to the
pool and reads each finished batch back from its slot.  ``__init__.py``
draws the data flow.
"""

import bisect
import functools
import itertools
import multiprocessing
import os
import time
import typing
from typing import Any, Callable, Dict, Optional, Tuple, Union
import warnings
import weakref

import numpy

from chainiter._cpus import usable_cpus
from chainiter._interrupts import uninterrupted
from chainiter.dataset.convert import concat_examples
from chainiter.errors import (
    ChainiterError, SharedMemoryWarning, TimeoutWarning, WorkerDiedError)
from chainiter.iterators import _args, order_samplers
from chainiter.iterators._base import DatasetIterator, _Failed
from chainiter.iterators._state import Step
from chainiter.iterators.multiprocess import (
    by_value, converted, launch, list_layout, read, remote, share,
    stacked_layout, stacked_rows)
from chainiter.iterators.multiprocess.stacked_layout import Rows
from chainiter.iterators.multiprocess.layout import Whole
from chainiter.iterators.multiprocess.pool import Pool
from chainiter.iterators.multiprocess.slots import (
    _SPARE_DESCRIPTORS, SlotPool, descriptor_room)


def _stacking_padding(converter):
    """``(True, padding)`` when ``converter`` is ``concat_examples`` or a
    ``functools.partial`` of it with only ``padding``; else ``(False, None)``."""
    if converter is concat_examples:
        return True, None
    if isinstance(converter, functools.partial) and \
            converter.func is concat_examples and not converter.args and \
            set(converter.keywords) <= {'padding'}:
        return True, converter.keywords.get('padding')
    return False, None


def _check_picklable(obj, what, method):
    try:
        # As the workers get it, large arrays left out: no copy of them.
        share.check_picklable(obj)
    except RuntimeError:
        # Locks, events and queues of multiprocessing pickle only while a
        # process starts; they reach the workers then.
        pass
    except by_value.Missing as e:
        raise TypeError(
            'MultiprocessIterator with start method {!r} sends the {} to the '
            'worker processes by pickling, and it holds {}: only cloudpickle '
            'can send that, by value, and it is not installed. Run: pip '
            'install cloudpickle (or define it at the top level of a module '
            'the workers can import, or use start_method="fork")'.format(
                method, what, by_value.describe(e.obj))) from e.error
    except Exception as e:
        raise TypeError(
            'MultiprocessIterator with start method {!r} sends the {} to the '
            'worker processes by pickling, but it cannot be pickled ({}: '
            '{}). Define its class and the functions it uses at module '
            'level (not inside a function), or use '
            'start_method="fork"'.format(method, what, type(e).__name__, e)
        ) from e


class _Group:
    """Batches loaded as one: their steps, and once it has arrived, the
    rows (``stacked``) or examples of all of them, cut at ``bounds``."""
    __slots__ = ('steps', 'seed', 'padded', 'handle', 'error', 'bounds',
                 'arrived', 'taken', 'stacked', 'examples', 'by_copy',
                 'tops', 'layout', '__weakref__')

    def __init__(self, seed, padded):
        self.steps = []
        self.seed = seed
        self.padded = padded
        self.handle = None      # the pool's, once sent
        self.error = None       # what sending it raised (Pool.post)
        self.bounds = None      # where each batch begins, once sent
        self.arrived = False
        self.taken = None       # its finished batch, taken ahead, until
        #                         the first of its batches is handed out
        self.stacked = self.examples = None
        self.by_copy = False
        self.tops = None        # padded: each batch's largest shapes
        self.layout = None      # and the layout they are of

    def task(self):
        """What the pool submits: the steps as one, the seed, and where
        each batch begins when padded (padding pads each batch to its own
        longest example: the workers then tell each batch's)."""
        self.bounds = list(itertools.accumulate(
            (len(step) for step in self.steps), initial=0))
        cuts = tuple(self.bounds[:-1]) if self.padded else ()
        return Step.join(self.steps), self.seed, cuts


def _batch_tops(buffers, parts, bounds):
    """Each batch's largest shape of every padded field (a list of
    ``{field index: shape}``, None unless every part is ``Rows``), from
    the parts the workers wrote, which never straddle two batches."""
    if buffers is None or not all(type(p) is Rows for p in parts):
        return None
    layout = buffers.layout
    tops = [[] for _ in bounds[:-1]]
    row = 0
    for part in parts:
        tops[bisect.bisect_right(bounds, row) - 1].append(part)
        row += part.n
    return [stacked_rows.tops_of(layout, batch) for batch in tops]


def _metas(batch):
    """What each chunk of a finished batch that holds no error tells."""
    return [batch.results[i].metas for i in range(batch.n_chunks)]


class _Member(typing.NamedTuple):
    """The handle of a batch in a group."""
    group: _Group
    index: int  # type: ignore[assignment]  # shadows tuple.index


def _rows(stacked, a, b):
    """Rows ``a...b - 1`` of a stacked batch."""
    if type(stacked) is tuple:
        return tuple(array[a:b] for array in stacked)
    if type(stacked) is dict:
        return {key: array[a:b] for key, array in stacked.items()}
    return stacked[a:b]


class MultiprocessIterator(DatasetIterator):
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
            ``stats['prefetch']`` tells the depth.
        prefetch_bytes (int): the shared memory the self-tuning depth may
            use for its slots (the depth + 2: the batch the user holds and
            the one being handed out); default 256 MiB.
        shared_mem (int or None): bytes of shared memory per example (None:
            measured from the first batch).  Larger examples are still
            delivered, with a ``SharedMemoryWarning``, and the buffers grow.
            When the workers stack the batch, the shapes are measured from
            the first batch and ``shared_mem`` lengthens the padded fields
            so that each example has room for that many bytes.
        dataset_timeout (float or None): warn with ``TimeoutWarning`` when no
            batch arrived for that many seconds.
        maxtasksperchild (int or None): replace a worker after that many
            tasks.
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
    batch with examples larger than any before, which grows them; a batch
    whose examples differ among themselves);
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
    # long, of at most MAX_GROUP batches (``_choose_group``).
    GROUP_S = 2e-3
    MAX_GROUP = 32
    GROUP_AFTER = 32       # batches measured first
    # Then measured again over as many batches as this, after as many
    # again; groups may grow once (``_measure_again``).
    REGROUP_AFTER = 1024

    TimeoutWarning = TimeoutWarning

    _pool: Any      # the Pool (None until started, and once finalized)

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
        self._pool = None
        # Read once (cgroup files: 0.15 ms), not at each tuning in next().
        self._cpus = usable_cpus()
        if n_processes is None:
            n_processes = self._cpus
        n_processes = _args.positive_int(
            'n_processes', n_processes,
            hint='; use SerialIterator to load in the main process')
        n_prefetch = _args.positive_int('n_prefetch', n_prefetch,
                                        allow_none=True)
        prefetch_bytes = _args.positive_int(
            'prefetch_bytes', prefetch_bytes, hint=' (bytes)')
        shared_mem = _args.positive_int(
            'shared_mem', shared_mem, allow_none=True,
            hint=' (bytes per example)')
        maxtasksperchild = _args.positive_int(
            'maxtasksperchild', maxtasksperchild, allow_none=True)
        dataset_timeout = _args.seconds('dataset_timeout', dataset_timeout)
        _args.callable_or_none('converter', converter)
        if not isinstance(converter_in_workers, bool):
            raise TypeError('converter_in_workers must be True or False, '
                            'got {!r}'.format(converter_in_workers))
        if converter_in_workers and converter is None:
            raise ValueError('converter_in_workers=True runs the converter '
                             'in the workers, but no converter was given: '
                             'pass converter=...')
        _args.callable_or_none('worker_init_fn', worker_init_fn)
        start_method = _args.start_method(start_method)
        launch.refuse_in_bootstrap(
            multiprocessing.get_context(start_method).get_start_method())
        super().__init__(dataset, batch_size, repeat, shuffle, order_sampler,
                         seed, shard)
        self.n_processes = n_processes
        self.n_prefetch = n_prefetch
        self.prefetch_bytes = prefetch_bytes
        self.shared_mem = shared_mem
        self.dataset_timeout = dataset_timeout
        self.maxtasksperchild = maxtasksperchild
        self.converter = converter
        self.worker_init_fn = worker_init_fn
        self.converter_in_workers = converter_in_workers
        self._stacked, self._padding = _stacking_padding(converter)
        # concat_examples stacks in the workers already, with no copy.
        self._in_workers = converter_in_workers and not self._stacked
        self._warned_size = False
        self._warned_mismatch = False
        # Batches may go to the workers in groups (``_choose_group``) only
        # where that changes nothing the user sees: an explicit n_prefetch
        # counts batches, maxtasksperchild tasks.
        self._may_group = self._stacked and n_prefetch is None and \
            maxtasksperchild is None and shared_mem is None

        ctx = multiprocessing.get_context(start_method)
        method = ctx.get_start_method()
        if method != 'fork':
            _check_picklable(dataset, 'dataset', method)
            if worker_init_fn is not None:
                _check_picklable(worker_init_fn, 'worker_init_fn', method)
            if self._in_workers:
                _check_picklable(converter, 'converter', method)
        self.start_method = method
        self._max_depth = n_prefetch or \
            self.MAX_PREFETCH_PER_WORKER * n_processes
        # Until the first batch is measured, 1: that batch is then split
        # among the workers and arrives soonest.
        self._first_depth = n_prefetch or 1
        if self._in_workers:
            # At least a batch per worker in flight, to start with (the
            # book never splits a batch for the converter in the workers:
            # it takes whole ones).
            self._first_depth = max(self._first_depth, n_processes)
            self._max_depth = max(self._max_depth, n_processes)
        self._start_transport()
        self._start_pool()
        if self._pool.slots.layout is not None:      # from shared_mem
            self._tune_depth(self._pool.slots.layout.slot_bytes)
        # Until the first batch has sized the buffers, batches travel
        # through the socket: send only that one, the rest follow it.
        self._dispatch_until(self._prefetch_depth
                             if self._pool.slots.layout is not None else 1)

    @property
    def stats(self) -> Dict[str, Any]:
        stats = super().stats
        stats['by_copy'] = self._by_copy
        stats['prefetch'] = self._prefetch_depth
        stats['batches_per_task'] = self._group
        pool = self._pool
        stats['workers_active'] = self.n_processes if pool is None else \
            pool.book.active
        stats['worker_busy'], stats['worker_cpu_wait'] = \
            self._worker_busy(stats['workers_active'])
        return stats

    def reset_stats(self) -> None:
        self._by_copy = 0
        super().reset_stats()

    def _ready_batches(self):
        """The batches of the finished jobs that wait in the pool (a batch,
        or a group), and of the group taken ahead.  The pool hands jobs
        out in the order they were sent: the first ``n_ready()`` sent and
        not collected, a group counted once, as many batches as it has."""
        if self._pool is None:
            return 0
        ahead = self._ahead_group
        count = 0 if ahead is None else len(ahead.steps)
        jobs = self._pool.n_ready()
        last = None
        for _, handle in list(self._pending):
            if jobs <= 0:
                break
            if type(handle) is _Member:
                group = handle.group
                if group is last or group.handle is None or \
                        group.arrived or group.taken is not None:
                    continue        # counted, not sent, or collected
                last = group
                count += len(group.steps)
            elif handle is None or isinstance(handle, _Failed):
                continue            # never sent
            else:
                count += 1
            jobs -= 1
        return count

    def _stats_window_started(self):
        pool = self._pool
        self._busy_mark = (id(pool), 0.0, 0.0) if pool is None else \
            (id(pool), pool.book.load_s, pool.book.queued_s)

    def _worker_busy(self, active):
        """``(worker_busy, worker_cpu_wait)`` over the window: the share
        of the active workers' time spent loading (waits for a CPU
        included), and the share of that spent waiting for a CPU; None
        before the window or any loading."""
        pool, since = self._pool, self._timing.since
        if pool is None or since is None:
            return None, None
        span = time.perf_counter() - since
        pool_id, loaded, queued = self._busy_mark
        if pool_id != id(pool):     # a new pool since the window began
            loaded = queued = 0.0
        loaded = pool.book.load_s - loaded
        queued = pool.book.queued_s - queued
        if span <= 0:
            return None, None
        busy = min(1.0, (loaded + queued) / (max(active, 1) * span))
        return busy, (queued / (loaded + queued) if loaded + queued > 0
                      else None)

    def _floor_depth(self):
        """The fewest batches in flight, whatever ``prefetch_bytes`` holds:
        two per worker, or two for each worker that can run at once (the
        CPUs), as long as the workers share those batches' chunks
        (``Book.open_batch``) and all of them hold one: each slot more
        only costs its memory and the workers' first touch of it (16
        workers of 38 MB batches on 2 CPUs: 1.2 GB).  Not when a batch may
        not be split: for the converter in the workers (one batch a
        worker), or where each chunk counts against
        ``maxtasksperchild``."""
        n = self.n_processes
        if self._in_workers or self.maxtasksperchild is not None:
            return 2 * n
        return max(2 * min(n, self._cpus), -(-n // self.batch_size))

    def _tune_depth(self, slot_bytes):
        """The self-tuning depth, from the size of a batch's slot."""
        if self.n_prefetch is not None:
            self._tuned = True
            return
        n = self.n_processes
        group = self._group
        fits = self.prefetch_bytes * group // max(slot_bytes, 1) - 2
        if group > 1:
            # As many batches in flight as one by one, in groups; each
            # worker still has two (small: fewer would be split in more
            # chunks, each a message).
            depth = max(2 * n, -(-min(self._max_depth, fits) // group))
        else:
            depth = max(self._floor_depth(), min(self._max_depth, fits))
        room = descriptor_room()
        if room is not None:
            # A slot holds two descriptors here (its file's and its
            # mapping's) and one in each worker, and slots leave a spare
            # (slots.py): take half of the rest, for the program's needs.
            depth = max(1, min(depth, (room - _SPARE_DESCRIPTORS) // 4 - 2))
        if depth * self._group != self._prefetch_depth:
            # The pool counts groups, the iterator batches.
            self._pool.set_depth(depth)
            self._prefetch_depth = depth * self._group
        self._tuned = True      # last: an interrupt before has it tuned again

    def _start_transport(self):
        # The workers start with the first batch (at once when built, at
        # the first next() when unpickled: unpickling may happen while a
        # spawned process starts, where no process may be started).
        self._pool = None
        self._finalizer = None
        self._by_copy = 0           # for stats: batches that came by copy
        self._prefetch_depth = self._first_depth  # measured again
        self._tuned = False         # from the first batch's slot
        self._group = 1             # batches loaded as one
        self._group_mark = None     # (batches measured, load_s, ...)
        self._groupable = self._may_group
        self._regroup = None        # (batches since, load_s, loaded)
        self._open = None           # the group being filled
        self._ahead_group = None    # the next group, taken ahead
        self._busy_mark = (None, 0.0, 0.0)  # (id(pool), load_s, queued_s)

    def _start_pool(self):
        # With the converter in the workers a slot holds one converted
        # batch: a list layout of one region.
        slots = SlotPool(self._max_depth + 2,
                         1 if self._in_workers else self.batch_size,
                         self._stacked, self._padding, self.shared_mem)
        if self.shared_mem is not None and not self._stacked:
            # Before any worker starts: they get it as they start.
            slots.replace(list_layout.list_layout(
                slots.batch_size, self.shared_mem * self.batch_size //
                slots.batch_size))
        dataset = self.dataset
        if self._in_workers:
            dataset = converted.WithConverter(dataset, self.converter)
            slots.measure = converted.result_bytes
        self._pool = Pool(multiprocessing.get_context(self.start_method),
                          dataset, self.n_processes, self._worker_seed,
                          self.worker_init_fn, self.maxtasksperchild,
                          self._prefetch_depth, slots,
                          split=not self._in_workers, cpus=self._cpus)
        self._finalizer = weakref.finalize(self, self._pool.close)

    @property
    def _worker_seed(self):
        """The seed the workers' global generators and ``WorkerInfo`` get:
        the iterator's, or, sharded, one of ``(seed, rank)``."""
        if self._shard is None:
            return self._seed
        return order_samplers.rank_seed(self._seed, self._shard.rank)

    def _transport_attributes(self):
        return super()._transport_attributes() + (
            '_pool', '_finalizer', '_busy_mark', '_open', '_ahead_group')

    # ---- transport ----------------------------------------------------------

    def __next__(self):
        self._leave_parents_pool()
        return super().__next__()

    def _leave_parents_pool(self):
        """In a forked child (os.fork(), or a fork Process given the
        iterator) the workers are the parent's: leave them alone, and load
        on from the current state with workers of its own."""
        pool = self._pool
        if pool is not None and pool.owner != os.getpid():
            self._finalizer.detach()
            self._start_transport()
            self._rewind()

    def _drop_pending(self):
        self._open = self._ahead_group = None
        if self._pool is not None:
            self._pool.new_generation()
        super()._drop_pending()

    def _interrupted_waiting(self):
        # Waiting in Pool.wait for the batch of the first pending handle,
        # nothing taken: every batch (or group) dispatched is in flight
        # or ready, or was taken ahead and is held by its group
        # (``_take_ahead``).  What the call did before it waited (sent
        # batches, posted groups, tuned the depth) it did whole.
        pool = self._pool
        return pool is not None and pool.interrupted_waiting()

    def _collect(self, handle):
        if not self._tuned and self._pool.slots.layout is not None:
            # A Ctrl-C cut the first batch short after its buffers were
            # made and before the depth was tuned.
            self._tune_depth(self._pool.slots.layout.slot_bytes)
        if type(handle) is _Member:
            return self._collect_member(handle)
        batch, chunks, error = self._wait(handle)
        if error is not None:
            raise error
        if self._in_workers:
            return self._collect_converted(self._pool, batch, chunks)
        stacked, examples, by_copy = self._read(batch, chunks)
        self._by_copy += by_copy
        if stacked is not None:
            if self._groupable:
                self._measure_for_group(len(batch.step))
            return stacked
        return self._convert(examples)

    def _wait(self, handle):
        """The finished batch of ``handle``, its chunks' results, and the
        error a worker raised loading it (or None)."""
        batch = self._pool.wait(handle, self.dataset_timeout)
        if batch.failure is not None:
            if type(batch.failure) is WorkerDiedError:
                return batch, None, batch.failure
            raise batch.failure
        for i in range(batch.n_chunks):
            error = batch.results[i].error
            if error is not None:
                return batch, None, remote.rebuild_error(error)
        return batch, _metas(batch), None

    def _read(self, batch, chunks):
        """``(stacked, examples, by_copy)``: the stacked batch read from
        its slot, or else its examples, to convert."""
        pool = self._pool
        prepared = batch.prepared
        exporter = pool.hand_out(batch)
        if prepared is not None:    # read by the receiver thread
            return prepared[1], None, False
        if exporter is None:     # the batch came through the socket
            examples = [meta.example for chunk in chunks for meta in chunk]
            if pool.slots.layout is None:
                self._fit_buffers(examples, None, ())
                layout = pool.slots.layout
                self._tune_depth(0 if layout is None else layout.slot_bytes)
            return None, examples, True
        layout = batch.buffers.layout
        stacked, examples, oversize = read.read_batch(
            numpy.frombuffer(exporter, dtype=numpy.uint8), layout, chunks)
        if stacked is not None:
            return stacked, None, False
        if oversize:
            self._fit_buffers(examples, layout, oversize)
        # Some of it came through the socket, or the main process stacks
        # it.
        return None, examples, bool(oversize) or layout.mode == 'stacked'

    # ---- groups: several small batches loaded as one ----------------------

    def _measure_for_group(self, size):
        """Count a batch the workers stacked; after ``GROUP_AFTER`` of
        them (the workers past their first, slower examples), choose the
        group."""
        book = self._pool.book
        if self._group_mark is None:
            self._group_mark = (0, book.load_s, book.loaded, size)
            return
        count, load_s, loaded, first = self._group_mark
        count += 1
        self._group_mark = (count, load_s, loaded, first)
        if count < self.GROUP_AFTER or size != first or \
                book.loaded <= loaded:     # no result measured since
            return
        self._groupable = False       # chosen once (grown once)
        self._choose_group((book.load_s - load_s) /
                           (book.loaded - loaded) * size)

    def _choose_group(self, per_batch):
        """How many batches go to the workers as one: as many as load in
        about ``GROUP_S`` (``per_batch``: the seconds a batch takes a
        worker), at most ``MAX_GROUP``, within the slots' share of
        ``prefetch_bytes``.  Each batch otherwise costs the main process
        and a worker a message, a wake-up and its bookkeeping, which
        small batches cannot pay back."""
        layout = self._pool.slots.layout
        group = int(self.GROUP_S / max(per_batch, 1e-9))
        fits = self.prefetch_bytes // (
            (2 * self.n_processes + 2) * max(stacked_layout.resized(
                layout, self.batch_size).slot_bytes, 1))
        group = min(group, fits, self.MAX_GROUP)
        if group < max(2, 1.5 * self._group):
            return
        # All of it or nothing: buffers of K batches' rows with the slots
        # still sized for one would be grown too small.
        with uninterrupted():
            try:
                self._pool.use_layout(stacked_layout.resized(
                    layout, group * self.batch_size))
            except MemoryError:
                return
            if self._group == 1:
                self._regroup = (0, None, None)
            self._pool.slots.batch_size = group * self.batch_size
            self._pool.read_ahead = True
            self._group = group
            self._tune_depth(self._pool.slots.layout.slot_bytes)

    def _submit(self, step):
        if self._pool is None:
            self._start_pool()
        if self._group == 1:
            return self._pool.submit(step, self._pass_seed)
        group = self._open
        if group is None:
            group = self._open = _Group(self._pass_seed,
                                        self._padding is not None)
        member = _Member(group, len(group.steps))
        group.steps.append(step)
        if len(group.steps) == self._group:
            # The receiver thread is woken for it by a later next()
            # (_work_ahead), or when it wakes anyway.
            self._send(group, wake=False)
        return member

    def _send(self, group, wake=True):
        """Post a full group: the receiver thread submits it, between
        ``next()`` calls (a group of 32 small batches took ``next()``
        0.3 ms to submit, 3x a ``next()`` that submits nothing)."""
        if self._open is group:
            self._open = None
        self._pool.post(group, wake)

    def _collect_member(self, member):
        group = member.group
        if group.handle is None:
            if self._open is group:     # not full: it goes as it is
                self._send(group)
            # Posted, and the receiver thread has not got to it yet.
            self._pool.submit_posted()
            if group.error is not None:
                raise group.error
        if not group.arrived:
            if group.taken is not None:     # taken ahead, not read yet
                self._arrive(group, group.taken)
            else:
                batch, chunks, error = self._wait(group.handle)
                if error is not None:
                    return self._ungroup()
                self._arrive(group, batch, chunks)
        if group.taken is not None:
            # Taken ahead: its slot is the user's from now on (a fork
            # then keeps it for the child).
            self._pool.hand_out(group.taken)
            group.taken = self._ahead_group = None
        a, b = group.bounds[member.index], group.bounds[member.index + 1]
        last = member.index + 1 == len(group.steps)
        self._by_copy += group.by_copy
        if group.stacked is not None:
            batch = _rows(group.stacked, a, b)
            if group.tops is not None:
                batch = stacked_rows.cut_to(batch, group.layout,
                                            group.tops[member.index])
            if last:
                group.stacked = None    # the slot is free once the user's
            self._work_ahead(member)    # arrays are gone
            return batch
        examples = group.examples[a:b]
        if last:
            group.examples = None
        self._work_ahead(member)
        return self._convert(examples)

    def _arrive(self, group, batch, chunks=None):
        """Take in the finished batch of a group: read it, or its
        examples, for its members to be cut from.  ``chunks``: what
        ``_wait`` returned; None for the batch taken ahead
        (``group.taken``: read by the receiver thread, no error in it,
        handed out with its first batch)."""
        group.arrived = True
        if self._padding is not None:
            if chunks is None:
                chunks = _metas(batch)
            chunks = [part for chunk in chunks for part in chunk.metas]
            group.tops = _batch_tops(batch.buffers, chunks, group.bounds)
            group.layout = batch.buffers and batch.buffers.layout
        if batch is group.taken:
            group.stacked = batch.prepared[1]
        else:
            group.stacked, group.examples, group.by_copy = self._read(
                batch, chunks)
        if group.stacked is not None and batch.slot is not None:
            # Arrays the iterator keeps: a fork while the user holds
            # none of this group's batches leaves the slot in use.
            self._pool.slots.keep(batch.slot, group)
        if self._regroup is not None and group.stacked is not None:
            self._measure_again(len(group.steps))
        if group.stacked is None and batch.slot is not None:
            # Examples that differ among the batches (bucketed data, a
            # changed dtype) do not stack as one: from now on each batch
            # goes alone.  (A group that found no free slot, its batches
            # held, came through the socket as it is.)
            self._stop_grouping()

    def _work_ahead(self, member):
        """The main thread's part in loading the next groups, spread over
        the ``next()`` calls that hand out this one (a group's first
        ``next()`` did it all, and took 3-4x the others: 0.05 against
        0.015 ms, on groups of tiny batches).  A quarter of the way
        through this group the receiver thread is woken for the groups
        posted since (``Pool.wake_posted``); halfway through, the next
        group's batch is taken from the pool (``Pool.take``) if it has
        arrived, read ahead by the receiver thread (it then holds no
        error); three quarters through, the batch taken is read."""
        size = len(member.group.steps)
        index = member.index
        if index == size // 4:
            self._pool.wake_posted()
        if index == size // 2:
            self._take_ahead(member, size)
        if index == 3 * size // 4:
            ahead = self._ahead_group
            if ahead is not None and not ahead.arrived:
                self._arrive(ahead, ahead.taken)

    def _take_ahead(self, member, size):
        pending = self._pending
        offset = size - member.index    # the next group's first batch
        if offset >= len(pending):
            return
        handle = pending[offset][1]
        if type(handle) is not _Member or handle.index != 0:
            return
        ahead = handle.group
        if ahead.handle is None or ahead.arrived or ahead.taken is not None:
            return
        ahead.taken = self._pool.take(ahead.handle)
        if ahead.taken is not None:
            self._ahead_group = ahead

    def _measure_again(self, size):
        """The first measure (of the first ``GROUP_AFTER`` batches) takes
        the workers' start: each first touches the dataset's pages, and the
        more workers, the fewer batches each has loaded (16 workers
        measured twice the time a batch of tiny examples took 2, and
        chose half their groups).  Once ``REGROUP_AFTER`` more batches
        have gone, the next as many are measured, and the groups grow if
        half as large again fit in ``GROUP_S``."""
        count, load_s, loaded = self._regroup
        count += size
        book = self._pool.book
        if load_s is None:
            if count >= self.REGROUP_AFTER:
                count, load_s, loaded = 0, book.load_s, book.loaded
        elif count >= self.REGROUP_AFTER and book.loaded > loaded:
            self._regroup = None
            self._choose_group((book.load_s - load_s) /
                               (book.loaded - loaded) * self.batch_size)
            return
        self._regroup = (count, load_s, loaded)

    def _ungroup(self):
        """A group failed (an example raised, or killed its worker): load
        its batches, and all that follow, one by one, so that the error
        comes from the batch that holds the example, after the batches
        before it."""
        self._rewind()
        self._stop_grouping()
        self._dispatch_until(1)
        return self._collect(self._pending[0][1])

    def _stop_grouping(self):
        if self._group > 1:
            if self._open is not None:
                # The group being filled goes now, before the batches
                # that follow it go one by one: the pool hands batches
                # out in the order they were sent.
                self._send(self._open)
            self._group = 1
            self._pool.read_ahead = False
            self._regroup = None
            self._prefetch_depth = self._pool.book.n_prefetch

    def _collect_converted(self, pool, batch, chunks):
        """The batch the converter made in a worker."""
        metas = [meta for chunk in chunks for meta in chunk]
        if len(metas) != 1:      # a batch cut among workers: never made
            raise ChainiterError(
                'MultiprocessIterator with converter_in_workers=True got a '
                'batch in {} parts; please report this'.format(len(metas)))
        meta, = metas
        if type(meta) is converted.Failed:
            raise converted.rebuild_error(meta.error, batch.step.indices)
        exporter = pool.hand_out(batch)
        if type(meta) is not Whole:
            return converted.read_result(
                numpy.frombuffer(exporter, dtype=numpy.uint8), meta)
        self._by_copy += 1
        result = meta.example
        layout = None if exporter is None else batch.buffers.layout
        if layout is not None or pool.slots.layout is None:
            self._fit_buffers([result], layout,
                              () if layout is None else [result])
            if layout is None and pool.slots.layout is not None:
                self._tune_depth(pool.slots.layout.slot_bytes)
        return result

    def _convert(self, examples):
        if self.converter is not None:
            return self.converter(examples)
        return examples

    def _fit_buffers(self, examples, layout, oversize):
        """Size the buffers from a batch that did not (fully) go through
        them: the first batch, or one with an oversize example."""
        slots = self._pool.slots
        if slots.cannot_grow:
            return
        new, mismatch = slots.fit(examples, layout, oversize)
        if mismatch is not None:
            self._warn_mismatch(mismatch)
        if new is None:
            return
        if layout is not None and oversize and not self._warned_size:
            self._warned_size = True
            need = max(slots.measure(e) for e in oversize)
            warnings.warn(
                ('a converted batch' if self._in_workers else 'an example') +
                ' with {} bytes of arrays did not fit its shared '
                'memory ({} bytes per example); it was delivered intact '
                'through a copy and the buffers were enlarged. Pass '
                'shared_mem={} (or more) to reserve enough from the '
                'start'.format(need, layout.slot_bytes // slots.batch_size,
                               new.slot_bytes // slots.batch_size),
                SharedMemoryWarning, stacklevel=4)
        if layout is None:
            self._pool.use_layout(new)   # no room at all: a clear error
            return
        try:
            self._pool.use_layout(new)
            self._tune_depth(new.slot_bytes)
        except MemoryError as e:
            # The old buffers stay; larger examples keep coming by copy.
            slots.cannot_grow = True
            warnings.warn('the shared-memory buffers could not be enlarged, '
                          'so larger examples keep coming by copy: {}'.format(
                              e), SharedMemoryWarning, stacklevel=4)

    def _warn_mismatch(self, how):
        if self._warned_mismatch:
            return
        self._warned_mismatch = True
        warnings.warn(
            'a batch did not match the layout measured from the first batch '
            '({}) in a way the shared-memory buffers cannot adapt to, so the '
            'main process stacked it from copies, which is slower; every '
            'such batch is. Give every example the same structure (and '
            'padded fields the same dtype and number of dimensions) to have '
            'the workers stack it in shared memory'.format(how),
            SharedMemoryWarning, stacklevel=5)

    def finalize(self) -> None:
        # Whole or not at all: a Ctrl-C comes once the pool is closed.
        with uninterrupted():
            self._leave_parents_pool()     # nothing of the parent's to end
            super().finalize()
            if self._finalizer is not None:
                self._finalizer()
