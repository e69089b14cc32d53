"""A shared-memory slot and the slots of one layout (``Slot``,
``Buffers``), and whether a slot is free to reuse: no batch in flight is
its and no array handed out views it (``idle``), or only the arrays the
iterator keeps do (``kept_only``).  ``slots.py``'s ``SlotPool`` holds
them."""

import sys

import numpy

from chainiter.dataset.stacked_examples import StackedExamples
from chainiter.iterators.pipeline.memory.read import Apart


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
    """Whether the objects that the iterator keeps (``keep``: a stacked
    batch, a list batch of examples made of views of its rows, or the
    batches of an ``Apart`` group) are all that view ``exporter``, the
    slot's hand-out: no array of the user's does, nor anything of the
    user's that holds one (a list batch handed out holds the iterator's
    own examples, the same objects).

    Each array read from a slot, and each view of one (numpy makes its
    base the first array that owns no data of its own), has for base a
    uint8 array of the exporter's bytes: references to that, beyond the
    kept arrays', are arrays held elsewhere (or views of them); and
    references to a kept array or a kept example (a tuple, a dict, a
    list), beyond those from the kept objects, are the user's."""
    holder = slot.kept() if slot.kept is not None else None
    stacked = None if holder is None else holder.stacked
    if stacked is None:
        return False
    kept = _kept_views(
        stacked.batches if type(stacked) is Apart else [stacked], exporter)
    if kept is None:
        return False
    objects, edges, bases, viewing = kept
    if not bases:
        return False    # what keeps the exporter alive is not kept
    # An object with the references ``objects[i]`` has when nothing else
    # holds it (one from the list, one for the call), counted the same
    # way on every Python version.
    probe = [object()]
    extra = sys.getrefcount(probe[0])
    for i in range(len(objects)):
        if sys.getrefcount(objects[i]) != extra + edges[i]:
            return False
    for i in range(len(bases)):
        if sys.getrefcount(bases[i]) != extra + viewing[i]:
            return False
    return True


def _kept_views(roots, exporter):
    """What ``kept_only`` counts in the objects kept (``roots``, which
    the user never gets, only new views or lists of what they hold):
    ``(objects, edges, bases, viewing)``, each object that holds or is
    an array viewing the exporter (a tuple, list or dict, or a
    ``StackedExamples``'s own: its examples, rows and ``rows``) with the
    references to it from the kept objects, and each base array of the
    exporter's bytes with the kept arrays that view it.  None when a
    kept array views memory of another kind (it cannot be told)."""
    objects, edges, kids, index = [], [], [], {}
    bases, viewing, base_index = [], [], {}
    # (object, the index of the object that holds it; _ROOT for a root's
    # value, None for a root)
    stack = [(root, None) for root in roots]
    while stack:
        obj, parent = stack.pop()
        if type(obj) is numpy.ndarray:
            children = None
        else:
            children = _children(obj)
            if children is None:
                continue     # holds no array
        if parent is not None:
            i = index.get(id(obj))
            if i is not None:       # met before, through another holder
                edges[i] += 1
                if parent != _ROOT:
                    kids[parent].append(i)
                continue
            i = index[id(obj)] = len(objects)
            objects.append(obj)
            edges.append(1)
            kids.append(None if children is None else [])   # None: an array
            if parent != _ROOT:
                kids[parent].append(i)
        else:
            i = _ROOT       # a root: the iterator's, never handed out
        if children is not None:
            stack.extend((child, i) for child in children)
            continue
        base = obj.base
        if base is None:
            continue        # an array of its own
        if type(base) is not numpy.ndarray or base.base is not exporter:
            return None
        j = base_index.get(id(base))
        if j is None:
            j = base_index[id(base)] = len(bases)
            bases.append(base)
            viewing.append(0)
        viewing[j] += 1
    # Only what leads to an array of the slot counts (an example's
    # tuple of Python values may be shared, as ``()`` is): the arrays,
    # then what holds one, until nothing changes (a value met first
    # through one holder may be held by another met before).
    leads = [these is None and o.base is not None
             for o, these in zip(objects, kids)]
    changed = True
    while changed:
        changed = False
        for i, these in enumerate(kids):
            if these and not leads[i] and any(leads[k] for k in these):
                leads[i] = changed = True
    return ([o for o, yes in zip(objects, leads) if yes],
            [e for e, yes in zip(edges, leads) if yes], bases, viewing)


# ``_kept_views``: the holder of a root's values.
_ROOT = -1


def _children(obj):
    """The values a kept container holds, or None for any other value."""
    kind = type(obj)
    if kind is tuple or kind is list:
        return list(obj)
    if kind is dict:
        return list(obj.values())
    if kind is StackedExamples:
        return list(obj) + [value for value in (obj.stacked, obj.rows)
                            if value is not None]
    return None


def idle(slot, generation):
    """No batch in flight of ``generation`` is the slot's and no array
    handed out views it (``owner`` read once: ``hand_over`` clears it
    without the lock)."""
    owner = slot.owner
    return (owner is None or owner[0] != generation) and \
        (slot.exporter is None or slot.exporter() is None)
