"""The snapshot codec, pure: an iterator's state to a snapshot's fields and
back.

::

    save(serializer, state, ...)       the fields of chainiter's layout
    read(serializer, Target) ──► Snapshot(state, seed, resets, version)
                                       every field checked against the
                                       iterator that loads it, or a
                                       SnapshotMismatchError
    holds_sampler_state(...)           whether an order sampler's state is
                                       there whole (or, in Chainer's, not)
    as_chainer_writes(items, ...)      the epoch's order as Chainer writes it

The layout (``FORMAT_VERSION``): ``current_position``, ``epoch``,
``is_new_epoch``, ``previous_epoch_detail``, ``seed``, ``reset_count``,
``dataset_length``; the epoch's order as ``order`` (an order sampler's), or
named by ``seeded_order`` (a seeded shuffle's, a pure function of the seed);
a sharded iterator adds ``shard_size`` and ``global_batch_size``.  An order
sampler's own state lies under ``order_sampler``: the iterator reads it
(``DatasetIterator._load_snapshot``), as it changes the sampler.

``read`` changes nothing: the iterator adopts its value all at once.  Each
field is read and checked by ``_snapshot_fields.py``.  A snapshot with a
format version must hold every field its version writes
(``WRITTEN_BY_EVERY``), and one with a field only chainiter writes must
hold a format version: only Chainer's snapshots go without (no seed, no
reset count: the iterator keeps its seed, the pass is the first).
"""

import typing
from typing import Dict, Optional, Tuple

import numpy

from chainiter.errors import SnapshotMismatchError
from chainiter.iterators import _state, order_samplers
from chainiter.iterators._snapshot_fields import (
    check_order, check_shard_fields, field, flag, integer, real, required)

#: Version of the snapshot layout written by ``save`` (3: a seeded
#: shuffle's order is named by ``seeded_order``, not stored; a sharded
#: iterator adds ``shard_size`` and ``global_batch_size``, which older
#: versions ignore).
FORMAT_VERSION = 3

#: The fields that every snapshot of a format version holds, whatever
#: iterator wrote it (the order, an order sampler's state and the shard
#: fields depend on the iterator): one that lacks one of them lost it on
#: the way (2 added ``reset_count``).  ``previous_epoch_detail`` is
#: written too, but may be missing, as in Chainer, which guesses it (its
#: own test of old snapshots deletes it from what our iterator wrote): the
#: batches do not depend on it.
_WRITTEN_BY_VERSION_1 = ('current_position', 'epoch', 'is_new_epoch',
                         'seed', 'dataset_length')
WRITTEN_BY_EVERY: Dict[int, Tuple[str, ...]] = {
    1: _WRITTEN_BY_VERSION_1,
    2: _WRITTEN_BY_VERSION_1 + ('reset_count',),
    3: _WRITTEN_BY_VERSION_1 + ('reset_count',),
}

#: Fields that only chainiter writes (always with ``format_version``);
#: Chainer's snapshots hold none of them, and no format version.
CHAINITER_FIELDS = ('seed', 'reset_count', 'dataset_length', 'seeded_order',
                    'shard_size', 'global_batch_size')


def is_deserializer(serializer):
    """Whether ``serializer`` reads (ours and Chainer's alike)."""
    return any(cls.__name__ == 'Deserializer'
               for cls in type(serializer).__mro__)


def is_chainers(serializer):
    """Whether ``serializer`` is Chainer's: they derive from the classes of
    chainer.serializer (known by their module: Chainer is never imported
    to ask)."""
    return any(cls.__module__ == 'chainer.serializer'
               for cls in type(serializer).__mro__)


class Target(typing.NamedTuple):
    """The iterator a snapshot is read for; the snapshot must fit it."""
    dataset_length: int
    shuffle: bool           # a seeded shuffle
    sampler: bool           # an order sampler
    global_batch_size: int
    #: The seed a sharded iterator was built with (every rank must load
    #: the same run), else None.
    pinned_seed: Optional[int] = None


class Snapshot(typing.NamedTuple):
    """What ``read`` found: the state (with no ``sampler_state``), the seed
    (None where the snapshot holds none: the iterator keeps its own), the
    number of resets and the format version (None for a snapshot written
    by Chainer, which holds only Chainer's fields)."""
    state: _state.IteratorState
    seed: Optional[int]
    resets: int
    version: Optional[int] = None


# ---- writing -------------------------------------------------------------

def save(serializer, state, seed, resets, dataset_length, shard_size=None,
         global_batch_size=None):
    """Write ``state`` in chainiter's layout: a seeded order is named by
    ``seeded_order`` and the seed, not stored.  ``shard_size`` and
    ``global_batch_size`` are those of a sharded iterator, else None."""
    serializer('format_version', FORMAT_VERSION)
    serializer('current_position', state.current_position)
    serializer('epoch', state.epoch)
    serializer('is_new_epoch', state.is_new_epoch)
    if isinstance(state.order, order_samplers.SeededPermutation):
        serializer('seeded_order', True)
    elif state.order is not None:
        serializer('order', state.order)
    serializer('previous_epoch_detail', state.previous_epoch_detail)
    serializer('seed', seed)
    serializer('reset_count', resets)
    serializer('dataset_length', dataset_length)
    if shard_size is not None:
        serializer('shard_size', shard_size)
        serializer('global_batch_size', global_batch_size)
    if state.sampler_state is not None:
        child = serializer['order_sampler']
        for key, value in state.sampler_state.items():
            child(key, value)


def as_chainer_writes(items, chainer_order, chainers):
    """``items`` (a snapshot in chainiter's layout, as ``state_dict()`` has
    it) with the epoch's order as Chainer's iterator of this kind writes
    it: a seeded order written out, under Chainer's key ``chainer_order =
    (key, writes_none)`` (``_order`` for MultithreadIterator), and None
    where Chainer writes it (into Chainer's serializers only, ``chainers``:
    chainiter's snapshots hold no pickled value).  The seed stays:
    chainiter reading it back keeps its seed, Chainer reads only the keys
    it knows."""
    items = dict(items)
    key, writes_none = chainer_order
    order = None
    for name in ('order', '_order'):
        value = items.pop(name, None)
        if value is not None and numpy.asarray(value).dtype != object:
            order = value
    if order is None and bool(items.get('seeded_order', False)):
        order = order_samplers.seeded_order(
            order_samplers.pass_seed(int(items['seed']),
                                     int(items['reset_count'])),
            int(items['epoch']), int(items['dataset_length']))
    if order is not None or (writes_none and chainers):
        items[key] = order
    return items


# ---- reading -------------------------------------------------------------

def read(serializer, target: Target) -> Snapshot:
    """The snapshot in ``serializer``, every field checked against
    ``target``; a ``SnapshotMismatchError`` says what does not fit."""
    n = target.dataset_length
    version = format_version(serializer)
    length = field(serializer, 'dataset_length')
    if length is not None and integer(length, 'dataset_length') != n:
        raise SnapshotMismatchError(
            'the snapshot was written for a dataset of length {}, but '
            'this iterator\'s dataset has length {}'.format(int(length), n))
    position = integer(required(serializer, 'current_position'),
                       'current_position')
    epoch = integer(required(serializer, 'epoch'), 'epoch')
    is_new_epoch = flag(required(serializer, 'is_new_epoch'),
                        'is_new_epoch')
    seeded, order = _order(serializer, target)
    size = n if order is None else len(order)
    if not 0 <= position <= size or epoch < 0:
        raise SnapshotMismatchError(
            'the snapshot position (epoch {}, position {}) does not fit '
            'an epoch of {} examples'.format(epoch, position, size))
    seed = _seed(serializer)
    check_shard_fields(serializer)
    resets = field(serializer, 'reset_count')
    resets = 0 if resets is None else integer(resets, 'reset_count')
    if resets < 0:
        raise SnapshotMismatchError(
            'the snapshot has reset_count {}; it must be >= 0'.format(
                resets))
    previous = field(serializer, 'previous_epoch_detail')
    if previous is not None:
        previous = real(previous, 'previous_epoch_detail')
    else:
        previous = guess_previous_epoch_detail(
            epoch, position, size, target.global_batch_size)
    pinned = target.pinned_seed
    if pinned is not None and seed is not None and seed != pinned:
        raise SnapshotMismatchError(
            'the snapshot was written with seed {}, but this sharded '
            'iterator was built with seed={}: every rank must load the '
            'same run. Build it with seed={} (or seed=None) to load '
            'it'.format(seed, pinned, seed))
    if seeded:
        order = _seeded_order(order, seed, resets, epoch, n)
    return Snapshot(_state.IteratorState(position, epoch, is_new_epoch,
                                         order, previous), seed, resets,
                    version)


def format_version(serializer):
    """The snapshot's format version, None for Chainer's snapshots; a
    snapshot of chainiter's that lost fields on the way (a framework that
    keeps some keys, a hand-edited dict) is refused, naming the first one
    it lacks: without it, it would resume elsewhere, or in other orders."""
    version = field(serializer, 'format_version')
    if version is None:
        for key in CHAINITER_FIELDS:
            if field(serializer, key) is not None:
                raise SnapshotMismatchError(
                    'the snapshot has {!r} but no \'format_version\': '
                    'chainiter writes one into every snapshot, so this one '
                    'lost fields on the way. Load the whole state dict '
                    'that state_dict() returned (or the whole npz '
                    'file)'.format(key))
        return None
    version = integer(version, 'format_version')
    if version > FORMAT_VERSION:
        raise SnapshotMismatchError(
            'the snapshot has format version {}, newer than this '
            'chainiter understands ({}); upgrade chainiter'.format(
                version, FORMAT_VERSION))
    if version < 1:
        raise SnapshotMismatchError(
            'the snapshot has format version {}; versions start at 1, so '
            'the snapshot is corrupt'.format(version))
    for key in WRITTEN_BY_EVERY[version]:
        if field(serializer, key) is None:
            raise SnapshotMismatchError(
                'the snapshot (format version {}) has no {!r}, which every '
                'snapshot of that version holds: it lost fields on the way '
                '(a framework or a JSON or YAML round trip that kept only '
                'some keys?). Load the whole state dict that state_dict() '
                'returned (or the whole npz file)'.format(version, key))
    return version


def holds_sampler_state(serializer, state, version, sampler):
    """Whether the snapshot (``serializer``: its ``order_sampler`` part)
    holds every field of ``state``, the state of the order sampler
    ``sampler`` as ``_orders.capture`` gives it; False where it holds none
    and was written by Chainer (``version`` None), whose snapshots hold no
    sampler state.  A part of it, or none in a snapshot of chainiter's,
    raises, naming the first field missing."""
    # A field the sampler holds as None reads as None from the snapshot
    # too, whether it is there or not: only the others can be missed.
    state = {key: value for key, value in state.items()
             if not _holds_none(value)}
    missing = ['order_sampler/' + key for key in state
               if field(serializer, key) is None]
    if not missing:
        return True
    if len(missing) == len(state) and version is None:
        return False
    raise SnapshotMismatchError(
        'the snapshot has no {!r}, part of the state of this iterator\'s '
        'order sampler ({}): {}. Load it into an iterator built with the '
        'order sampler that wrote it, with every key that state_dict() '
        'returned'.format(
            missing[0], type(sampler).__name__,
            'it lost fields on the way' if len(missing) < len(state) else
            'it was written by an iterator whose order sampler has no '
            'state, or it lost fields on the way'))


def _holds_none(value):
    """Whether ``value`` is how ``DictionarySerializer`` writes None."""
    return isinstance(value, numpy.ndarray) and value.dtype == object and \
        value.ndim == 0 and value.item() is None


def guess_previous_epoch_detail(epoch, position, size, global_batch_size):
    """``previous_epoch_detail`` where a snapshot lacks it (old Chainer
    versions): guessed as Chainer does."""
    previous = epoch + (position - global_batch_size) / max(size, 1)
    if epoch + position / max(size, 1) > 0:
        return max(previous, 0.0)
    return _state.NO_PREVIOUS_EPOCH_DETAIL


def _order(serializer, target):
    """``(seeded, order)``: whether the snapshot's order follows from its
    seed, and the order it holds (None: none, or the identity)."""
    seeded = field(serializer, 'seeded_order')
    seeded = seeded is not None and flag(seeded, 'seeded_order')
    order = field(serializer, 'order')
    if order is None:
        order = field(serializer, '_order')
    if seeded and not target.shuffle:
        raise SnapshotMismatchError(
            'the snapshot was written by an iterator whose order follows '
            'from its seed (shuffle=True), but this iterator {}; build '
            'it with shuffle=True and no order_sampler to load it'.format(
                'uses an order_sampler' if target.sampler
                else 'does not shuffle'))
    shuffles = target.shuffle or target.sampler
    if order is None and shuffles and not seeded:
        raise SnapshotMismatchError(
            'the snapshot has no order (no \'order\', no \'seeded_order\'), '
            'so it was written by an iterator that does not shuffle (or it '
            'lost those fields on the way); this one shuffles. Build the '
            'iterator with shuffle=False to load it')
    if order is not None:
        if not shuffles:
            raise SnapshotMismatchError(
                'the snapshot holds a shuffled order, but this iterator '
                'does not shuffle; build it with shuffle=True (or the '
                'same order_sampler) to load it')
        order = check_order(order, target.dataset_length, target.shuffle)
    return seeded, order


def _seed(serializer):
    seed = field(serializer, 'seed')
    if seed is None:
        return None
    seed = integer(seed, 'seed')
    if not 0 <= seed < 2 ** 63:
        raise SnapshotMismatchError(
            'the snapshot has seed {}; a seed is in [0, 2**63)'.format(seed))
    return seed


def _seeded_order(order, seed, resets, epoch, n):
    """The order the seed gives (checked against the one the snapshot
    holds, if any).  ``seed`` is there: ``seeded_order`` comes with a
    format version, whose snapshots all hold one."""
    derived = order_samplers.SeededPermutation(
        order_samplers.pass_seed(seed, resets), epoch, n)
    if order is not None and not numpy.array_equal(order, derived):
        raise SnapshotMismatchError(
            'the snapshot\'s order is not the one its seed gives for '
            'epoch {}; the snapshot is corrupt'.format(epoch))
    return derived
