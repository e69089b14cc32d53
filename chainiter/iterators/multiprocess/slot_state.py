"""A shared-memory slot and the slots of one layout (``Slot``,
``Buffers``), and whether a slot is free to reuse: no batch in flight is
its and no array handed out views it (``idle``), or only the arrays the
iterator keeps do (``kept_only``).  ``slots.py``'s ``SlotPool`` holds
them."""

import sys

import numpy

from chainiter.iterators.multiprocess.read import Apart, stacked_arrays


class Slot:
    __slots__ = ('exporter', 'index', 'kept', 'owner', 'shared')

    def __init__(self, index):
        self.index = index
        self.shared = None     # its SharedBuffer, once it is first needed
        self.owner = None      # (generation, seq) of the batch it is for
        self.exporter = None   # weak reference to the hand-out's exporter
        self.kept = None       # weak reference to what ``keep`` was given


class Buffers:
    """The slots of one layout."""

    def __init__(self, buffer_id, layout, n_slots):
        self.id = buffer_id
        self.layout = layout
        self.slots = [Slot(i) for i in range(n_slots)]
        self.cannot_allocate = False
        self.next = 0    # slots are freed about in turn: look here first

    def allocated(self):
        return [slot for slot in self.slots if slot.shared is not None]


def kept_only(slot, exporter):
    """Whether the arrays that the iterator keeps (``keep``: a stacked
    batch, or the batches of an ``Apart`` group) are all that view
    ``exporter``, the slot's hand-out: no array of the user's does.
    Each array read from a slot, and each view of one (numpy makes its
    base the first array that owns no data of its own), has for base the
    one uint8 array of the exporter's bytes: references to that, beyond
    the kept arrays', are arrays held elsewhere (or views of them)."""
    holder = slot.kept() if slot.kept is not None else None
    stacked = None if holder is None else holder.stacked
    arrays = []
    for batch in stacked.batches if type(stacked) is Apart else [stacked]:
        these = stacked_arrays(batch)
        if these is None:
            return False
        arrays.extend(these)
    base = arrays[0].base
    if type(base) is not numpy.ndarray or base.base is not exporter or \
            any(type(a) is not numpy.ndarray or a.base is not base
                for a in arrays):
        return False
    # An object with the references ``base`` has when nothing else holds
    # it (one from each kept array, one from this frame), counted the
    # same way on every Python version.
    probe = object()
    probes = [probe] * len(arrays)
    counts = sys.getrefcount(base), sys.getrefcount(probe)
    del probes
    return counts[0] == counts[1]


def idle(slot, generation):
    """No batch in flight of ``generation`` is the slot's and no array
    handed out views it (``owner`` read once: ``hand_over`` clears it
    without the lock)."""
    owner = slot.owner
    return (owner is None or owner[0] != generation) and \
        (slot.exporter is None or slot.exporter() is None)
