"""Snapshots as flat ``.npz`` files (Chainer's ``save_npz``/``load_npz``).

Files are read with ``allow_pickle=False``.  The one pickled value Chainer
writes into snapshots, ``None`` (a 0-d object array; Chainer's
``MultithreadIterator`` stores an unshuffled order so), is recognised by
its exact bytes (``_pickled_none.py``); nothing is ever unpickled.  A
snapshot saved to a path is written whole or not at all
(``_whole_file.py``).
"""

import os
from typing import IO, Any, Callable, Dict, Optional, Sequence, Union

import numpy

from chainiter.errors import SnapshotMismatchError
from chainiter.serializers._base import Deserializer, Serializer
from chainiter.serializers._pickled_none import READ_ERRORS, read_none
from chainiter.serializers._whole_file import write_whole

#: What ``ignore_names`` takes: a key, a callable that takes a key and
#: returns True to skip it, or a list of them.
_IgnoreNames = Union[str, Callable[[str], bool],
                     Sequence[Union[str, Callable[[str], bool]]], None]


class DictionarySerializer(Serializer):
    """Writes values into a flat dictionary keyed by ``path/key``.

    Args:
        target (dict or None): the dictionary to fill (a new one if None).
        path (str): the prefix of every key.
    """

    def __init__(self, target: Optional[Dict[str, Any]] = None,
                 path: str = '') -> None:
        self.target = {} if target is None else target
        self.path = path

    def __getitem__(self, key: str) -> 'DictionarySerializer':
        key = key.strip('/')
        return DictionarySerializer(self.target, self.path + key + '/')

    def __call__(self, key: str, value: Any) -> Any:
        key = key.lstrip('/')
        # None is stored as a 0-d object array, as Chainer does.
        self.target[self.path + key] = numpy.asarray(value)
        return value


def serialize(obj):
    """``obj``'s state as a dict of arrays (keys as in an npz snapshot)."""
    serializer = DictionarySerializer()
    serializer.save(obj)
    return serializer.target


def save_npz(file: Union[str, bytes, os.PathLike, IO[bytes]], obj: Any,
             compression: bool = True) -> None:
    """Save ``obj`` (anything with ``serialize``) to an npz file.

    Args:
        file (str or file-like): destination.
        obj: the object to save, e.g. an iterator.
        compression (bool): use ``numpy.savez_compressed``.
    """
    target = serialize(obj)
    save = numpy.savez_compressed if compression else numpy.savez
    if isinstance(file, (str, bytes, os.PathLike)):
        # Exactly this path: given a name, numpy would append '.npz', and
        # Chainer's trainer names its snapshots without a suffix.
        write_whole(file, lambda f: save(f, **target))
    else:
        save(file, **target)


class NpzDeserializer(Deserializer):
    """Reads values from an npz file (or any mapping of arrays).

    Args:
        npz: the result of ``numpy.load`` or a dict of arrays.
        path (str): the prefix of every key.
        strict (bool): raise ``KeyError`` for a key the file lacks; when
            False a missing key leaves the value unchanged.
        ignore_names (str, callable or list of them): keys to skip; a callable
            takes the key and returns True to skip it.
    """

    def __init__(self, npz: Any, path: str = '', strict: bool = True,
                 ignore_names: _IgnoreNames = None) -> None:
        self.npz = npz
        self.path = path
        self.strict = strict
        if ignore_names is None:
            ignore_names = []
        elif callable(ignore_names) or isinstance(ignore_names, str):
            ignore_names = [ignore_names]
        self.ignore_names = list(ignore_names)

    def __getitem__(self, key: str) -> 'NpzDeserializer':
        key = key.strip('/')
        return NpzDeserializer(self.npz, self.path + key + '/',
                               strict=self.strict,
                               ignore_names=self.ignore_names)

    def _ignored(self, key):
        for name in self.ignore_names:
            if (callable(name) and name(key)) or name == key:
                return True
        return False

    def __call__(self, key: str, value: Any) -> Any:
        key = self.path + key.lstrip('/')
        if self._ignored(key):
            return value
        if key not in self.npz:
            if self.strict:
                raise KeyError('{} is not a key of the snapshot'.format(key))
            return value
        try:
            stored = numpy.asarray(self.npz[key])
        except READ_ERRORS as e:
            stored = read_none(self.npz, key, e)
        if stored.dtype == object and stored.shape == () and \
                stored[()] is None:
            return None     # stored as None (Chainer returns None too)
        if value is None:
            return stored
        if isinstance(value, numpy.ndarray):
            if value.shape != stored.shape:
                raise SnapshotMismatchError(
                    '{!r} has shape {} in the snapshot but {} here'.format(
                        key, stored.shape, value.shape))
            numpy.copyto(value, _converted(stored, value.dtype, key))
            return value
        value_type = type(value)
        if isinstance(value, (bool, numpy.bool_)):
            return value_type(stored.item())
        if (numpy.issubdtype(stored.dtype, numpy.number)
                and not (numpy.issubdtype(stored.dtype, numpy.integer)
                         and issubclass(value_type, int))
                and not numpy.can_cast(stored.dtype, value_type)):
            raise TypeError(
                'cannot assign the snapshot value {!r} of dtype {} to a {} '
                'without loss'.format(key, stored.dtype, value_type.__name__))
        return value_type(stored.item() if stored.ndim == 0 else stored)


def _converted(stored, dtype, key):
    """``stored``, a snapshot's array, for an array of ``dtype``: as it is
    where numpy casts it safely (or narrows a float, as Chainer does), else
    converted where every value survives: a state dict read back from JSON
    or YAML has its uint32 arrays as lists of Python ints (int64)."""
    if numpy.can_cast(stored.dtype, dtype, 'safe') or (
            dtype.kind in 'fc' and numpy.can_cast(stored.dtype, dtype,
                                                  'same_kind')):
        return stored
    if stored.dtype.kind in 'biuf' and dtype.kind in 'biufc':
        with numpy.errstate(all='ignore'):
            converted = stored.astype(dtype)
        lost = numpy.flatnonzero(converted.ravel() != stored.ravel())
        if not lost.size:
            return converted
        example = stored.ravel()[lost[0]].item()
    else:
        example = stored.ravel()[0].item() if stored.size else None
    raise SnapshotMismatchError(
        '{!r} holds values of dtype {} in the snapshot that do not convert '
        'to {} without loss (e.g. {!r}); the snapshot was written for '
        'another object, or its values were changed'.format(
            key, stored.dtype, dtype, example))


def load_npz(file: Union[str, bytes, os.PathLike, IO[bytes]], obj: Any,
             path: str = '', strict: bool = True,
             ignore_names: _IgnoreNames = None) -> None:
    """Load ``obj``'s state from an npz file written by ``save_npz``.

    Args:
        file (str or file-like): the npz file.
        obj: the object to load into (its ``serialize`` is called).
        path (str): the part of the file to read, e.g. ``'updater/iterator:main/'``
            for an iterator inside a Chainer trainer snapshot.
        strict (bool): fail on a key the file lacks.
        ignore_names: keys to skip (see ``NpzDeserializer``).

    The file is read with ``allow_pickle=False``.  A file that is not an npz
    file, or is truncated, raises ``SnapshotMismatchError``.
    """
    if isinstance(file, (str, bytes)) or hasattr(file, '__fspath__'):
        with open(file, 'rb') as f:
            return _load_npz(f, file, obj, path, strict, ignore_names)
    return _load_npz(file, file, obj, path, strict, ignore_names)


def _load_npz(f, name, obj, path, strict, ignore_names):
    # numpy.load is given an open file: on a damaged file it would
    # otherwise leave its own file object open.
    try:
        npz = numpy.load(f, allow_pickle=False)
    except READ_ERRORS as e:
        raise SnapshotMismatchError(
            'cannot read {!r} as an npz snapshot ({}: {}); pass a file '
            'written by chainiter.serializers.save_npz or '
            'chainer.serializers.save_npz'.format(
                name, type(e).__name__, e)) from e
    if not isinstance(npz, numpy.lib.npyio.NpzFile):
        raise SnapshotMismatchError(
            '{!r} holds a single .npy array, not an npz snapshot'.format(name))
    with npz:
        obj.serialize(NpzDeserializer(
            npz, path=path, strict=strict, ignore_names=ignore_names))
