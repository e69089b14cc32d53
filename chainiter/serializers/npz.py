"""Snapshots as flat ``.npz`` files (Chainer's ``save_npz``/``load_npz``).

Files are read with ``allow_pickle=False``.  The one pickled value Chainer
writes into snapshots, ``None`` (a 0-d object array; Chainer's
``MultithreadIterator`` stores an unshuffled order so), is recognised by
its exact bytes; nothing is ever unpickled.
"""

import errno
import os
import secrets
import stat
import zipfile
import zlib
from typing import IO, Any, Callable, Dict, Optional, Sequence, Union

import numpy

from chainiter._interrupts import uninterrupted
from chainiter.errors import SnapshotMismatchError
from chainiter.serializers._base import Deserializer, Serializer

# What numpy.load and reading a member raise on a file that is not a (whole)
# npz file.
_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile,
                zlib.error, KeyError, NotImplementedError)


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
        _write_whole(file, lambda f: save(f, **target))
    else:
        save(file, **target)


def _write_whole(path, write):
    """``write(f)`` into a new file beside ``path`` (the file a symbolic
    link names), flushed to the disk, which then takes the place of
    ``path``: a save that fails (a full disk, a Ctrl-C) leaves the
    snapshot that was there whole.  A file saved over keeps its mode and,
    where this process may set it, its owner (the new file is private
    until then); a new one gets what ``open()`` gives.  Other hard links
    to the old file keep the old snapshot.  A process killed outright
    (SIGKILL) may leave the new file behind, named
    ``.NAME.XXXXXXXX.partial``.  Where no file may be made beside it, or
    put in its place (a directory one may not write, a sticky one, a
    file mounted there), or where it is no regular file (a pipe, a
    device), ``path`` is written in place, as ``open()`` would."""
    given = os.fsdecode(path)
    if given.endswith(os.sep) or os.path.isdir(given):
        raise IsADirectoryError(errno.EISDIR, 'Is a directory', given)
    path = os.path.realpath(given)
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    if old is not None and not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, 'Permission denied', given)
    if old is not None and not stat.S_ISREG(old.st_mode):
        _write_in_place(path, write)
        return
    directory, name = os.path.split(path)
    if len(os.fsencode(name)) > 200:     # room for the rest of the name
        name = 'snapshot'
    partial = f = None
    try:
        while partial is None:
            candidate = os.path.join(directory, '.{}.{}.partial'.format(
                name, secrets.token_hex(4)))
            with uninterrupted():     # made and known, or not made
                try:
                    fd = os.open(candidate,
                                 os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                 0o666 if old is None else 0o600)
                except FileExistsError:
                    continue
                except PermissionError:
                    break
                except FileNotFoundError:    # named as open() names it
                    raise FileNotFoundError(
                        errno.ENOENT, 'No such file or directory',
                        given) from None
                partial = candidate
                f = open(fd, 'wb')
        if partial is None:
            _write_in_place(path, write)
            return
        with f:
            if old is not None:
                _keep_owner_and_mode(fd, old)
            write(f)
            f.flush()
            os.fsync(fd)
        try:
            os.replace(partial, path)
        except OSError as e:
            if not isinstance(e, PermissionError) and \
                    e.errno not in (errno.EBUSY, errno.EXDEV):
                raise
            os.unlink(partial)
            partial = None
            _write_in_place(path, write)
            return
        partial = None
        _sync_directory(directory)
    except BaseException:
        if f is not None:
            f.close()
        if partial is not None:
            try:
                os.unlink(partial)
            except OSError:
                pass
        raise


def _write_in_place(path, write):
    with open(path, 'wb') as f:
        write(f)


def _keep_owner_and_mode(fd, old):
    try:
        os.fchown(fd, old.st_uid, old.st_gid)
    except OSError:       # not ours to give away: the mode still holds
        pass
    os.fchmod(fd, stat.S_IMODE(old.st_mode))


def _sync_directory(directory):
    """The rename on the disk too (best effort: not every system opens
    directories)."""
    with uninterrupted():     # opened and closed, or not opened
        try:
            fd = os.open(directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


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
        except _READ_ERRORS as e:
            stored = _read_none(self.npz, key, e)
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
            numpy.copyto(value, stored)
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


# The pickles numpy writes for ``numpy.asarray(None)`` (numpy.save: protocol
# 3 under numpy 1, 4 under numpy 2), and the other protocols for good
# measure.  A pickled value is compared with these, never unpickled: even a
# pickle that names only numpy's own classes can corrupt memory.
_TEXT_NONE_PICKLES = [
    b'\x80\x02cnumpy.core.multiarray\n_reconstruct\nq\x00cnumpy\nndarray\nq'
    b'\x01K\x00\x85q\x02c_codecs\nencode\nq\x03X\x01\x00\x00\x00bq\x04X\x06'
    b'\x00\x00\x00latin1q\x05\x86q\x06Rq\x07\x87q\x08Rq\t(K\x01)cnumpy\ndtype'
    b'\nq\nX\x02\x00\x00\x00O8q\x0b\x89\x88\x87q\x0cRq\r(K\x03X\x01\x00\x00'
    b'\x00|q\x0eNNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK?tq\x0fb\x89]q\x10Natq'
    b'\x11b.',
    b'\x80\x03cnumpy.core.multiarray\n_reconstruct\nq\x00cnumpy\nndarray\nq'
    b'\x01K\x00\x85q\x02C\x01bq\x03\x87q\x04Rq\x05(K\x01)cnumpy\ndtype\nq\x06X'
    b'\x02\x00\x00\x00O8q\x07\x89\x88\x87q\x08Rq\t(K\x03X\x01\x00\x00\x00|q\n'
    b'NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK?tq\x0bb\x89]q\x0cNatq\rb.',
]   # protocols 2 and 3 under numpy 1; numpy 2 names numpy._core
_NONE_PICKLES = frozenset([
    text.replace(b'numpy.core.multiarray', module)
    for text in _TEXT_NONE_PICKLES
    for module in (b'numpy.core.multiarray', b'numpy._core.multiarray')
] + [
    prefix + b'\x95' + (len(body)).to_bytes(8, 'little') + body
    for module in (b'numpy.core.multiarray', b'numpy._core.multiarray')
    for body in [
        b'\x8c' + bytes([len(module)]) + module + b'\x94\x8c\x0c_reconstruct'
        b'\x94\x93\x94\x8c\x05numpy\x94\x8c\x07ndarray\x94\x93\x94K\x00\x85\x94C'
        b'\x01b\x94\x87\x94R\x94(K\x01)h\x03\x8c\x05dtype\x94\x93\x94\x8c\x02O8'
        b'\x94\x89\x88\x87\x94R\x94(K\x03\x8c\x01|\x94NNNJ\xff\xff\xff\xffJ\xff'
        b'\xff\xff\xffK?t\x94b\x89]\x94Nat\x94b.']
    for prefix in (b'\x80\x04', b'\x80\x05')
])
_NONE_PICKLE_MAX = max(map(len, _NONE_PICKLES))


def _read_none(npz, key, error):
    """``key``'s value from an ``NpzFile`` opened with ``allow_pickle=False``
    when it is a pickled ``None``; any other failure says what is wrong."""
    damaged = SnapshotMismatchError(
        'cannot read {!r} from the snapshot: the file is damaged or holds '
        'a pickled object, which chainiter does not load ({}: {})'.format(
            key, type(error).__name__, error))
    member = key + '.npy'
    zip_file = getattr(npz, 'zip', None)
    if zip_file is None or member not in zip_file.namelist():
        raise damaged from error
    try:
        with zip_file.open(member) as f:
            fmt = numpy.lib.format
            read_header = {(1, 0): fmt.read_array_header_1_0,
                           (2, 0): fmt.read_array_header_2_0}.get(
                               fmt.read_magic(f))
            if read_header is None:
                raise damaged from error
            shape, _, dtype = read_header(f)
            payload = f.read(_NONE_PICKLE_MAX + 1)
    except _READ_ERRORS as e:
        raise damaged from e
    if dtype != object or shape != () or payload not in _NONE_PICKLES:
        raise damaged from error
    return numpy.asarray(None)


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
    except _READ_ERRORS as e:
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
