"""The shared-memory slots a batch is written into, and their layouts.

Each batch (or group of batches loaded as one) in flight owns a slot (a
``SharedBuffer`` of its own, allocated when a batch first needs one).
There are ``n_slots``: the deepest pipeline the iterator may tune to
(``MAX_PREFETCH_PER_WORKER`` per worker, or an explicit ``n_prefetch``
if more: it is a floor), plus the
batch the user holds and one being handed out.  Its pages are
reserved by the workers, not here: each worker that receives a slot
reserves it (``posix_fallocate``) before it maps it, and uses it only
when that worked; the main process only checks that the file system has
the room.  Reserving 32 slots of 38 MB took the first ``next()`` of 16
workers 0.55 s in the main process; the workers do it in parallel, each
for the slots it writes into.  A slot is reused
only when no task may still write into it and no array handed to the user
still views it: every hand-out exports the slot through one ctypes object,
and a weak reference to it tells when the last view is gone.  When no slot
is free the batch travels through the socket instead.

The layout is measured from the first batch (``fit``) and grows when an
example does not fit (a stacked field without padding takes rows of any
dtype and shape within its bytes: ``stacked_layout.py``); new buffers
replace the old ones, whose slots stay for the batches still in flight or
handed out from them and are unmapped as soon as those are gone.  So the
memory is bounded by ``n_slots`` slots of the largest layout (each field
at most ``GROWTH`` times the largest row seen), plus the old slots that
the user's arrays still view.

No processes or threads here.  The pool calls it under its lock, from
the main thread (``submit``, ``use_layout``, ``hand_out``) and from the
receiver thread (a posted group's ``submit`` allocates slots there too;
a batch read ahead views its slot there); it sends what it allocates to
the workers.  The main thread alone calls ``fit``, ``hand_over`` and
``keep``, without the lock (see their docstrings); ``retire_leased`` runs
under the lock in the thread that forked.
"""

import ctypes
import errno
import weakref

from chainiter.iterators.pipeline.memory import (
    exact_rows, list_layout, stacked_layout)
from chainiter._interrupts import uninterrupted
from chainiter.iterators.pipeline.memory.room import check_room
from chainiter.iterators.pipeline.memory.shm import SharedBuffer
from chainiter.iterators.pipeline.memory.slot_state import (
    Buffers, Slot, idle, kept_only)

GROWTH = 1.25                 # buffers grow at least by this factor

# Running out of these degrades to copies; other errors propagate.
_RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC)


class SlotPool:

    def __init__(self, n_slots, batch_size, stacked, padding, shared_mem,
                 exact=False, private=False):
        self.n_slots = n_slots
        # Worker threads write into the process's own memory: no file,
        # no descriptor (``SharedBuffer.private``).
        self.private = private
        self._allocate = SharedBuffer.private if private else \
            SharedBuffer.allocate
        self.batch_size = batch_size    # rows a slot holds (a group's)
        self.one_batch = batch_size     # the examples of one batch
        self.stacked = stacked
        self.padding = padding
        self.exact = exact      # stacked layouts are ``Layout.exact``
        self.shared_mem = shared_mem
        self.buffers = None
        # The lowest slot free first (few batches in flight: the same
        # slots stay warm in the caches), not the next in turn.
        self.lowest_first = False
        self.replaced = []      # earlier buffers, until the pool closes
        self.cannot_grow = False
        # The bytes an example (in list layouts) takes in a slot.
        self.measure = list_layout.example_array_bytes

    @property
    def layout(self):
        buffers = self.buffers
        return None if buffers is None else buffers.layout

    def free(self, generation, busy):
        """A slot for a new batch of ``generation``, or None;
        ``busy(buffer_id)`` gives the slots that tasks
        may still write into.  Raises MemoryError or OSError when a slot
        could not be allocated for want of memory, descriptors or room
        (later calls give None then)."""
        buffers = self.buffers
        if buffers is None:
            return None
        if self.replaced:
            self._release_replaced(generation, busy)
        slots = buffers.slots
        in_use = None
        start = 0 if self.lowest_first else buffers.next
        for k in range(start, start + len(slots)):
            slot = slots[k % len(slots)]
            if slot.shared is not None and idle(slot, generation):
                if in_use is None:
                    in_use = busy(buffers.id)
                if slot.index in in_use:
                    continue
                buffers.next = slot.index + 1
                return slot
        if buffers.cannot_allocate:
            return None
        for slot in slots:
            if slot.shared is None:
                try:
                    if not self.private:
                        check_room(buffers.layout.slot_bytes)
                    with uninterrupted():
                        slot.shared = self._allocate(
                            buffers.layout.slot_bytes, reserve=False)
                except (MemoryError, OSError) as e:
                    if isinstance(e, OSError) and \
                            e.errno not in _RESOURCE_ERRNOS:
                        raise
                    buffers.cannot_allocate = True
                    raise
                return slot
        return None

    def _release_replaced(self, generation, busy):
        """Unmap the slots of earlier buffers that nothing needs any more:
        no batch in flight is for them, no task may write into them and
        no array handed out views them.  Slots retired at a fork (never
        written again: a child may read them) too, once no array of this
        process views them: the child has a mapping of its own, which
        keeps their memory for as long as it lives."""
        kept = []
        for buffers in self.replaced:
            # Retired slots are no task's (their batches were handed out).
            in_use = busy(buffers.id) if buffers.id >= 0 else ()
            for slot in buffers.allocated():
                if idle(slot, generation) and slot.index not in in_use:
                    with uninterrupted():
                        slot.shared.release()
                        slot.shared = slot.exporter = slot.owner = None
            if buffers.allocated():
                kept.append(buffers)
        self.replaced = kept

    def replace(self, layout):
        """New buffers for ``layout``, with their first slot allocated (no
        room at all is a clear error now)."""
        old = self.buffers
        new = Buffers(0 if old is None else old.id + 1, layout, self.n_slots)
        with uninterrupted():
            new.slots[0].shared = self._allocate(layout.slot_bytes,
                                                 reserve=False)
            self.buffers = new
            if old is not None:
                # Batches in flight may still be handed out from the old
                # slots, and outboxes may still pass their descriptors.
                self.replaced.append(old)
        return new

    def retire_leased(self):
        """The process has forked: the child sees every slot that arrays of
        the parent view, and may read them for as long as it lives.  Those
        slots are never written again; new memory takes their place, and
        they are unmapped here once the parent's arrays are gone
        (``_release_replaced``).  (Not the slots of batches read ahead and
        not yet handed out, which still have an owner, nor those that only
        the iterator's own arrays view, ``keep``: no array of the user's
        views them.)"""
        buffers = self.buffers
        if buffers is None:
            return
        retired = []
        for slot in buffers.slots:
            exporter = None if slot.exporter is None else slot.exporter()
            if slot.shared is not None and slot.owner is None and \
                    exporter is not None and \
                    not kept_only(slot, exporter):
                gone = Slot(-1)
                gone.shared, gone.exporter = slot.shared, slot.exporter
                retired.append(gone)
                slot.shared = slot.exporter = slot.owner = None
        if retired:
            self.replaced.append(Buffers(-1, buffers.layout, 0))
            self.replaced[-1].slots = retired

    @staticmethod
    def exporter(batch):
        """The object every array of the batch's hand-out views."""
        return (ctypes.c_char * batch.buffers.layout.slot_bytes) \
            .from_buffer(batch.slot.shared.buffer)

    @staticmethod
    def lease(slot, exporter):
        """The batch in ``slot`` is handed out, its arrays viewing
        ``exporter``: the slot is free once that is gone."""
        SlotPool.view(slot, exporter)
        SlotPool.hand_over(slot)

    @staticmethod
    def view(slot, exporter):
        """The batch's arrays view ``exporter`` (read ahead): the slot is
        still the batch's (``owner``) until ``hand_over``, and not kept
        at a fork."""
        slot.exporter = weakref.ref(exporter)

    @staticmethod
    def keep(slot, holder):
        """The iterator keeps the arrays read from the batch in ``slot``
        in ``holder.stacked`` (an array, or a tuple or dict of them; a
        list batch's examples, a ``StackedExamples``; or an ``Apart`` of
        those) until it sets that to None, while the user gets views of
        them (new arrays, never these) or lists of its examples: at a
        fork, the slot is the child's too only if something else views
        it or holds one of those examples (``retire_leased``)."""
        slot.kept = weakref.ref(holder)

    def buffers_of(self, task):
        """The buffers whose slot ``task`` writes into: the buffers in use,
        or the earlier ones it was made for (a task that waited for a
        worker while the buffers were replaced: its batch reads that slot
        with that layout); None when it has no slot, or its buffers were
        retired at a fork (never written again)."""
        if task.slot < 0:
            return None
        buffers = self.buffers
        if buffers is not None and buffers.id == task.buffer_id:
            return buffers      # (nearly always)
        for buffers in self.replaced:
            if buffers.id == task.buffer_id:
                return buffers
        return None

    @staticmethod
    def hand_over(slot):
        """The batch in ``slot``, its exporter in it (``view``), is handed
        out.  Without the lock: ``idle`` reads the owner once, and the
        exporter, there first, keeps the slot busy."""
        slot.owner = None

    def release(self):
        """The pool is closed: unmap the slots now."""
        for buffers in self.replaced + [self.buffers]:
            if buffers is not None:
                for slot in buffers.allocated():
                    slot.shared.release()

    def fit(self, examples, layout, oversize):
        """The layout for buffers that fit ``examples`` (a batch that did
        not fully go through ``layout``: the first batch, or one with
        ``oversize`` examples), as ``(new_layout, mismatch)``: None when the
        buffers should stay, and a description when the batch does not
        match the stacked layout in a way no growth mends (the structure of
        the examples, a padded field's dtype or number of dimensions).

        Growth is measured against the buffers in use, which may have
        grown since ``layout`` (the batch's) was current.
        """
        new, mismatch = self._fit(examples, layout, self.layout)
        if new is None and mismatch is None and self.stacked and \
                len(examples) > self.one_batch:
            # A group whose batches do not stack as one (bucketed data,
            # a longer bucket among them): its batches fitted in turn,
            # each as its own, so that the buffers hold the largest.
            current = self.layout
            for k in range(0, len(examples), self.one_batch):
                grown, how = self._fit(examples[k:k + self.one_batch],
                                       layout, current)
                mismatch = mismatch or how
                if grown is not None:
                    new = current = grown
        if new is not None and self.exact and new.mode == 'stacked':
            new = new._replace(exact=True)
        return new, mismatch

    def _fit(self, examples, layout, current):
        """``fit``'s, against the layout ``current``."""
        new = None
        stacked = self.stacked
        if stacked and self.exact and \
                not exact_rows.exact_examples(examples):
            # A list batch whose examples would not come back from rows
            # as they were: the list layout, or the buffers as they are
            # (such examples come whole).
            if current is not None and current.mode == 'stacked':
                return None, None
            stacked = False
        if stacked:
            padding = self.padding
            if self.exact:
                # List batches: ragged arrays padded with 0 in the rows
                # (each example comes back cut to its shape), the fields
                # padded so far too.
                padding = stacked_layout.list_padding(
                    examples, current.padding if current is not None and
                    current.mode == 'stacked' else None, self.one_batch)
            new = stacked_layout.stacked_layout(
                examples, self.batch_size, padding)
            if current is not None and current.mode == 'stacked':
                if new is None:
                    return None, None  # cannot be stacked: keep the buffers
                if self.exact and new.padded != current.padded:
                    # A field of list batches took several shapes, for
                    # the first time: padded rows from now on.
                    return new, None
                how = stacked_layout.mismatch(current, new)
                if how is not None:
                    # Switching layouts would only make the batches like
                    # the first one miss in turn.
                    return None, how
                return stacked_layout.grown(current, new, examples,
                                            self.batch_size, GROWTH), None
            if new is not None and layout is None and self.shared_mem:
                new = stacked_layout.widen(new, examples, self.batch_size,
                                           self.shared_mem)
        if new is None:
            needed = max(self.measure(e) for e in examples)
            if needed == 0:
                return None, None  # no arrays: nothing for shared memory
            if current is not None and current.mode == 'list':
                if needed <= current.example_bytes:
                    return None, None     # the buffers have grown since
                needed = max(needed, int(current.example_bytes * GROWTH))
            new = list_layout.list_layout(self.batch_size, needed)
        return new, None
