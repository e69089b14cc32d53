"""Group flow: the iterator's steps for batches that go in groups
(``groups.py``): choosing the group size, collecting a member of a group,
taking in a group that arrived, working ahead, and going back to batches
one by one.  Each function takes the ``MultiprocessIterator`` as ``it``
and is called from its ``_collect``."""

import functools

from chainiter._interrupts import uninterrupted
from chainiter.iterators.pipeline import reading
from chainiter.iterators.pipeline.memory import stacked_layout
from chainiter.iterators.pipeline.flow import depth as _depth


def choose_group(it, per_batch):
    """Group the batches as ``Grouping.size`` says, within the budget
    of ``depth.largest_group``."""
    layout = it._t.pool.slots.layout
    fits = _depth.largest_group(it._options, stacked_layout.resized(
        layout, it.batch_size).slot_bytes)
    group = it._t.grouping.size(per_batch, fits, it._t.groups.size)
    if group is None:
        return
    # The buffers first, then the rest, all of it or nothing: slots
    # sized for one batch with buffers of K batches' rows hold what
    # goes alone meanwhile, and an interrupt in between leaves them
    # so; the other way round they would be grown too small.  The
    # waits for the pool's lock stay interruptible (Pool.submit).
    new = stacked_layout.resized(layout, group * it.batch_size)
    try:
        it._t.pool.use_layout(new)
    except MemoryError:
        return
    with uninterrupted():
        it._t.grouping.grouped(first=it._t.groups.size == 1)
        it._t.pool.slots.batch_size = group * it.batch_size
        it._t.pool.read_ahead = True
        it._t.groups.size = group
        it._t.tuned = False       # tuned in _collect if cut short
    it._tune_depth(new.slot_bytes)


def collect_member(it, member):
    group = member.group
    if member.index == 0:
        # A group taken ahead comes without Pool.wait, which raises the
        # warnings kept meanwhile (a worker's death among them).
        it._t.pool.raise_events()
    groups = it._t.groups
    groups.sent(it._t.pool, group)
    if not group.arrived:
        if group.taken is not None:     # taken ahead, not read yet
            arrive(it, group, group.taken)
        else:
            batch, chunks, error = reading.wait(
                it._t.pool, group.handle, it.dataset_timeout)
            if error is not None:
                return ungroup(it)
            arrive(it, group, batch, chunks)
    groups.hand_out_taken(it._t.pool, group)
    it._t.by_copy += group.by_copy
    stacked, examples = group.cut(member.index)
    work_ahead(it, member)
    if examples is None:
        return stacked
    return it._convert(examples)


def arrive(it, group, batch, chunks=None):
    """Take in the finished batch of a group: read it, or its
    examples, for its members to be cut from.  ``chunks``: what
    ``reading.wait`` returned; None for the batch taken ahead
    (``group.taken``: read by the receiver thread, no error in it,
    handed out with its first batch)."""
    group.arrived_as(batch, chunks)
    outgrew = False
    if batch is group.taken:
        group.stacked = batch.prepared[1]
    else:
        group.stacked, group.examples, group.by_copy, slot_bytes, \
            outgrew = reading.read(it._t.pool, batch, chunks, it._fitting)
        if slot_bytes is not None:
            it._tune_depth(slot_bytes)
    if group.stacked is not None and batch.slot is not None:
        # Arrays the iterator keeps: a fork while the user holds
        # none of this group's batches leaves the slot in use.
        it._t.pool.slots.keep(batch.slot, group)
    if group.stacked is not None:
        per_batch = it._t.grouping.group_arrived(
            len(group.steps), it._t.pool.book.meter.sample, it.batch_size)
        if per_batch is not None:
            choose_group(it, per_batch)
    if group.stacked is None and batch.slot is not None and \
            not outgrew:
        # Examples that differ among the batches (bucketed data, a
        # changed dtype) do not stack as one: from now on the groups'
        # batches are written apart, each read as its own
        # (``read.Apart``); when a group written so does not stack
        # either, each batch goes alone.  (A group that found no free
        # slot, its batches held, came through the socket as it is.  A
        # group with examples larger than their rows, a longer bucket,
        # came whole, and the buffers grew to hold the like: the groups
        # go on.)
        if group.apart:
            stop_grouping(it)
        else:
            it._t.groups.apart = True


def work_ahead(it, member):
    it._t.groups.work_ahead(it._t.pool, member, it._pending,
                            functools.partial(arrive, it))


def ungroup(it):
    """A group failed (an example raised, or killed its worker): load
    its batches, and all that follow, one by one, so that the error
    comes from the batch that holds the example, after the batches
    before it."""
    it._rewind()
    stop_grouping(it)
    it._dispatch_until(1)
    return it._collect(it._pending[0][1])


def stop_grouping(it):
    groups = it._t.groups
    if groups.size == 1:
        return
    pool = it._t.pool
    groups.stop(pool)
    it._t.grouping.stopped()
    pool.read_ahead = False
    # Slots of one batch again (their batch size first: an interrupt
    # in between leaves slots larger than they need be, never too
    # small), and the depth of batches that go one by one.
    pool.slots.batch_size = it.batch_size
    layout = pool.slots.layout
    if layout.mode == 'stacked':
        try:
            pool.use_layout(stacked_layout.resized(layout, it.batch_size))
        except MemoryError:
            pass        # the slots of a group hold a batch too
    it._tune_depth(pool.slots.layout.slot_bytes)
