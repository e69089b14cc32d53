"""Groups: several small batches loaded by one worker as one task, and
the mechanics of handing them out (the group being filled, the next group
taken ahead, the main thread's share of the work spread over the
``next()`` calls).  When to group, and how many, is ``grouping.py``'s."""

import bisect
import itertools
import typing

from chainiter.dataset.stacked_examples import StackedExamples
from chainiter.iterators._state import Step
from chainiter.iterators.pipeline.memory import stacked_read
from chainiter.iterators.pipeline.memory.read import Apart, stacked_arrays
from chainiter.iterators.pipeline.reading import metas
from chainiter.iterators.pipeline.memory.stacked_layout import Rows


class Group:
    """Batches loaded as one: their steps, and once it has arrived, the
    rows (``stacked``) or examples of all of them, cut at ``bounds``."""
    __slots__ = ('steps', 'seed', 'padded', 'apart', 'handle', 'error',
                 'bounds', 'arrived', 'taken', 'stacked', 'examples',
                 'by_copy', 'tops', 'layout', '__weakref__')

    def __init__(self, seed, padded, apart=False):
        self.steps = []
        self.seed = seed
        self.padded = padded
        self.apart = apart      # its batches written apart (``Apart``)
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

    def arrived_as(self, batch, chunks):
        """The group's finished ``batch`` arrived, its chunks' parts
        ``chunks`` (``reading.metas``: a padded group's chunks already
        cut in their parts; None: the batch taken ahead): with
        padding, each batch's largest shapes (a batch is
        padded to its own longest example)."""
        self.arrived = True
        if self.padded:
            if chunks is None:
                chunks = metas(batch)
            self.tops = batch_tops(batch.buffers, chunks, self.bounds)
            self.layout = batch.buffers and batch.buffers.layout

    def cut(self, index):
        """``(stacked, examples)``: the rows of batch ``index`` of the
        group, or its examples (to convert); dropped once the last batch
        is cut (the slot is free once the user's arrays are gone)."""
        a, b = self.bounds[index], self.bounds[index + 1]
        last = index + 1 == len(self.steps)
        if type(self.stacked) is Apart:
            # New views: the user's arrays are never those the iterator
            # keeps (``slot_state.kept_only`` tells them apart).
            batch = rows(self.stacked.batches[index], 0, b - a)
            if last:
                self.stacked = None
            return batch, None
        if self.stacked is not None:
            batch = rows(self.stacked, a, b)
            if self.tops is not None:
                batch = stacked_read.cut_to(batch, self.layout,
                                            self.tops[index])
            if last:
                self.stacked = None
            return batch, None
        examples = self.examples[a:b]
        if last:
            self.examples = None
        return None, examples

    def task(self):
        """What the pool submits: the steps as one, the seed, where
        each batch begins when padded (padding pads each batch to its own
        longest example: the workers then tell each batch's) or
        ``apart`` (each batch is read as its own: ``read.Apart``), and
        the tasks it counts as (``maxtasksperchild``): its batches."""
        self.bounds = list(itertools.accumulate(
            (len(step) for step in self.steps), initial=0))
        cuts = tuple(self.bounds[:-1]) if self.padded or self.apart \
            else ()
        return Step.join(self.steps), self.seed, cuts, len(self.steps)


class Member(typing.NamedTuple):
    """The handle of a batch in a group."""
    group: Group
    index: int  # type: ignore[assignment]  # shadows tuple.index


def batch_tops(buffers, parts, bounds):
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
    return [stacked_read.tops_of(layout, batch) for batch in tops]


def rows(stacked, a, b):
    """Rows ``a...b - 1`` of a stacked batch (or of a list of examples
    made of its rows)."""
    if type(stacked) is StackedExamples:
        return stacked.cut(a, b)
    if type(stacked) is tuple:
        return tuple(array[a:b] for array in stacked)
    if type(stacked) is dict:
        return {key: array[a:b] for key, array in stacked.items()}
    return stacked[a:b]


class Groups:
    """The iterator's groups: ``size`` batches go as one (1: each alone),
    ``open`` is the group being filled, ``ahead`` the next group whose
    batch was taken from the pool ahead (``take_ahead``), ``apart``
    whether the groups' batches are written apart (batches of several
    shapes or dtypes came: ``read.Apart``), ``seen`` the shapes and
    dtypes of the last batch that went alone."""

    __slots__ = ('size', 'open', 'ahead', 'apart', 'seen')

    def __init__(self):
        self.size = 1
        self.open = None
        self.ahead = None
        self.apart = False
        self.seen = None

    def saw(self, stacked):
        """A batch that went alone was read as ``stacked``: batches of
        several shapes or dtypes (bucketed data) make the groups, once
        they begin, go apart from the first (a group that mixes them
        would come by copy, and so would every group in flight with
        it)."""
        if self.apart:
            return
        if type(stacked) is StackedExamples:
            stacked = stacked.stacked
        seen = [(a.shape[1:], a.dtype)
                for a in stacked_arrays(stacked) or ()]
        if self.seen is not None and seen != self.seen:
            self.apart = True
        self.seen = seen

    def add(self, pool, step, seed, padded):
        """Put ``step`` in the open group (a new one if none); a full
        group is posted.  Returns its ``Member``."""
        group = self.open
        if group is None:
            group = self.open = Group(seed, padded, self.apart)
        member = Member(group, len(group.steps))
        group.steps.append(step)
        if len(group.steps) == self.size:
            # The receiver thread is woken for it by a later next()
            # (work_ahead), or when it wakes anyway; at once if a group
            # posted before still waits for it (no work_ahead came in
            # between: batches sent one by one before the groups began
            # were handed out, or the depth grew by two groups), so that
            # one group at most waits (``depth.at_least`` counts on it).
            self.send(pool, group, wake=bool(pool.posted))
        return member

    def send(self, pool, group, wake=True):
        """Post a full group: the receiver thread submits it, between
        ``next()`` calls (a group of 32 small batches took ``next()``
        0.3 ms to submit, 3x a ``next()`` that submits nothing)."""
        if self.open is group:
            self.open = None
        pool.post(group, wake)

    def sent(self, pool, group):
        """Make sure ``group`` was submitted (not full: it goes as it
        is); raises what submitting it raised."""
        if group.handle is None:
            if self.open is group:
                self.send(pool, group)
            # Posted, and the receiver thread has not got to it yet.
            pool.submit_posted()
            if group.error is not None:
                raise group.error

    def stop(self, pool):
        """From now on each batch goes alone; the group being filled
        goes now, before the batches that follow it go one by one: the
        pool hands batches out in the order they were sent.  What was
        posted is submitted now, into the slots of a group, before the
        iterator makes them the slots of one batch (what submitting it
        raises is kept for the ``next()`` that collects it)."""
        if self.open is not None:
            self.send(pool, self.open, wake=False)
        pool.submit_posted(keep_errors=True)
        self.size = 1

    def drop(self):
        """Forget the groups in flight (the pool dropped them)."""
        self.open = self.ahead = None

    def work_ahead(self, pool, member, pending, arrive):
        """The main thread's part in loading the next groups, spread over
        the ``next()`` calls that hand out this one (a group's first
        ``next()`` did it all, and took 3-4x the others: 0.05 against
        0.015 ms, on groups of tiny batches).  A quarter of the way
        through this group the receiver thread is woken for the groups
        posted since (``Pool.wake_posted``); halfway through, the next
        group's batch is taken from the pool (``Pool.take``) if it has
        arrived, read ahead by the receiver thread (it then holds no
        error); three quarters through, the batch taken is read
        (``arrive(group, batch)``)."""
        size = len(member.group.steps)
        index = member.index
        if index == size // 4:
            pool.wake_posted()
        if index == size // 2:
            self._take_ahead(pool, member, size, pending)
        if index == 3 * size // 4:
            ahead = self.ahead
            if ahead is not None and not ahead.arrived:
                arrive(ahead, ahead.taken)

    def _take_ahead(self, pool, member, size, pending):
        offset = size - member.index    # the next group's first batch
        if offset >= len(pending):
            return
        handle = pending[offset][1]
        if type(handle) is not Member or handle.index != 0:
            return
        ahead = handle.group
        if ahead.handle is None or ahead.arrived or ahead.taken is not None:
            return
        ahead.taken = pool.take(ahead.handle)
        if ahead.taken is not None:
            self.ahead = ahead

    def hand_out_taken(self, pool, group):
        """The first of ``group``'s batches goes to the user: the batch
        taken ahead is the user's from now on (a fork then keeps its slot
        for the child)."""
        if group.taken is not None:
            pool.hand_out(group.taken)
            group.taken = self.ahead = None

    def ready(self, handles, jobs):
        """Of ``handles`` (those pending, in order; None for a batch
        never sent), the batches of the first ``jobs`` jobs sent and not
        collected, a group counted once, as many batches as it has, and
        those of the group taken ahead."""
        ahead = self.ahead
        count = 0 if ahead is None else len(ahead.steps)
        last = None
        for handle in handles:
            if jobs <= 0:
                break
            if type(handle) is Member:
                group = handle.group
                if group is last or group.handle is None or \
                        group.arrived or group.taken is not None:
                    continue        # counted, not sent, or collected
                last = group
                count += len(group.steps)
            elif handle is None:
                continue            # never sent
            else:
                count += 1
            jobs -= 1
        return count
