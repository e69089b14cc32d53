"""``Pipeline``: the wiring of the pipeline, for either kind of worker.

It turns the iterator's steps (``_base.py``) into batches submitted to the
pool and reads each finished batch back from its slot.  ``__init__.py``
draws the data flow.  The subclasses (``processes/iterator.py``,
``threads/iterator.py``) read their arguments and name their workers'
kind (``_boundary``).
"""

import os
from typing import Any, Dict

from chainiter._interrupts import uninterrupted
from chainiter.errors import TimeoutWarning
from chainiter.iterators import order_samplers
from chainiter.iterators._base import DatasetIterator
from chainiter.iterators.pipeline import group_flow, reading
from chainiter.iterators.pipeline.flow import depth as _depth
from chainiter.iterators.pipeline.flow.grouping import Grouping
from chainiter.iterators.pipeline.groups import Member
from chainiter.iterators.pipeline.iterator_stats import IteratorStats
from chainiter.iterators.pipeline.memory.fitting import Fitting
from chainiter.iterators.pipeline.memory.room import descriptor_room
from chainiter.iterators.pipeline.transport import Transport


class Pipeline(IteratorStats, DatasetIterator):
    """The loading pipeline of ``MultiprocessIterator`` and
    ``MultithreadIterator``: steps submitted to the pool as tasks (a
    batch, a chunk of one, or a group of small batches), the self-tuned
    depth, and each finished batch read back from its slot.  A subclass
    builds ``self._options`` and calls ``_start()``; the pool's workers
    are processes or threads as the options say."""

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

    def _start(self):
        self._fitting = Fitting()   # the warnings given
        if self._options.start_method == 'threads':
            # No shared_mem to pass: the threads' buffers just grow.
            self._fitting.warned_size = True
        self._start_transport()
        self._start_pool()
        if self._t.pool.slots.layout is not None:      # from shared_mem
            self._tune_depth(self._t.pool.slots.layout.slot_bytes)
        # Until the first batch has sized the buffers, batches travel
        # whole (through the socket, for processes): send only that one,
        # the rest follow it.
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
                         None if self._t.pool.slots.private
                         else descriptor_room()),
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
        pool = self._t.pool
        if pool is not None and pool.main_tasks is not None and \
                pool.main_tasks.on:
            # The main thread loads only what next() waits for: a group
            # ahead is enough, and fewer slots stay warm in the caches.
            return self._t.groups.size
        return self._t.depth

    def _start_pool(self):
        self._t.start_pool(self, self._options, self._worker_seed,
                           self._boundary())

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

    def _collected(self):
        main = self._t.pool.main_tasks
        if main is not None and main.mode is not None:
            # Worker threads, with the GIL: where they load is measured.
            main.handed_out(self.batch_size, self._t.depth)

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
