"""A snapshot's fields, each read and checked, pure: ``field`` (an array,
or None where the snapshot has none) and ``required``; ``integer``,
``flag`` and ``real`` (a single number of that kind); ``check_order``
(the epoch's order) and ``check_shard_fields``.  What does not fit raises
a ``SnapshotMismatchError`` that names the field and the value seen."""

import numpy

from chainiter.errors import SnapshotMismatchError
from chainiter.iterators import _state


def field(serializer, key):
    """The field ``key`` as an array, or None where the snapshot has
    none."""
    try:
        value = serializer(key, None)
    except KeyError:
        return None
    return None if value is None else numpy.asarray(value)


def required(serializer, key):
    value = field(serializer, key)
    if value is None:
        raise SnapshotMismatchError(
            'the snapshot has no {!r}; it is not an iterator '
            'snapshot, or the iterator lies under a path (pass '
            'path=, e.g. "updater/iterator:main/")'.format(key))
    return value


def check_order(order, n, permutation):
    """The snapshot's ``order`` for a dataset of ``n`` examples (None for
    Chainer's None): any epoch's length for an order sampler's, a
    ``permutation`` of ``range(n)`` for a seeded shuffle's."""
    if order.ndim == 0 and order.dtype == object:
        return None   # Chainer writes None as a 0-d object array
    if order.shape == (0,):
        order = order.astype(numpy.intp)   # [] read back from JSON: floats
    if order.ndim != 1 or order.dtype.kind not in 'iu':
        raise SnapshotMismatchError(
            'the snapshot\'s order must be a 1-d array of integers, got '
            'shape {} of dtype {}'.format(order.shape, order.dtype))
    if permutation:
        if len(order) != n:
            raise SnapshotMismatchError(
                'the snapshot was written for a dataset of length {} '
                '(its order has {} entries), but this iterator\'s '
                'dataset has length {}'.format(len(order), len(order), n))
        if n and 0 <= order.min() and order.max() < n and \
                numpy.bincount(order, minlength=n).max() > 1:
            raise SnapshotMismatchError(
                'the snapshot\'s order repeats indices; a shuffled '
                'order is a permutation of range({})'.format(n))
    try:
        return _state.check_order(order, n)
    except ValueError as e:
        raise SnapshotMismatchError(
            'the snapshot\'s order does not fit this iterator\'s '
            'dataset of length {}: {}'.format(n, e)) from e


def check_shard_fields(serializer):
    """A snapshot of a sharded iterator loads on any number of ranks
    with any batch size (elastic): the state is the global position.
    Its shard fields are checked for sense only."""
    size = field(serializer, 'shard_size')
    global_batch = field(serializer, 'global_batch_size')
    if (size is None) != (global_batch is None):
        raise SnapshotMismatchError(
            'the snapshot has {!r} but not {!r}: it is corrupt, or lost '
            'a field on the way'.format(
                *(('shard_size', 'global_batch_size') if
                  global_batch is None else
                  ('global_batch_size', 'shard_size'))))
    if size is None:
        return
    size = integer(size, 'shard_size')
    global_batch = integer(global_batch, 'global_batch_size')
    if size < 1 or global_batch < 1 or global_batch % size:
        raise SnapshotMismatchError(
            'the snapshot has shard_size {} and global_batch_size {}: '
            'a global batch is shard_size (>= 1) times the batch size '
            '(>= 1); the snapshot is corrupt'.format(size, global_batch))


def _scalar(value, key):
    if value.shape != ():
        raise SnapshotMismatchError(
            'the snapshot\'s {} must be a single number, got an array of '
            'shape {}'.format(key, value.shape))
    return value


def integer(value, key):
    """A snapshot field that must be an integer (integral floats, as a
    state dict passed through JSON has them, are taken)."""
    value = _scalar(value, key)
    kind = value.dtype.kind
    if kind in 'iu' or (kind == 'f' and numpy.isfinite(value)
                        and float(value).is_integer()):
        number = int(value)
        if -2 ** 63 <= number < 2 ** 63:
            return number
    raise SnapshotMismatchError(
        'the snapshot\'s {} must be an integer, got {!r} of dtype {}'.format(
            key, value.item(), value.dtype))


def flag(value, key):
    value = _scalar(value, key)
    if value.dtype.kind == 'b' or (value.dtype.kind in 'iu'
                                   and int(value) in (0, 1)):
        return bool(value)
    raise SnapshotMismatchError(
        'the snapshot\'s {} must be a bool, got {!r} of dtype {}'.format(
            key, value.item(), value.dtype))


def real(value, key):
    value = _scalar(value, key)
    if value.dtype.kind in 'iuf' and numpy.isfinite(value):
        return float(value)
    raise SnapshotMismatchError(
        'the snapshot\'s {} must be a finite number, got {!r}'.format(
            key, value.item()))
