"""The one pickled value Chainer writes into snapshots, ``None``,
recognised by its exact bytes and never unpickled: ``read_none``, given a
member that numpy would not read without pickles (``allow_pickle=False``).
``READ_ERRORS``: what reading a file that is not a whole npz file raises."""

import zipfile
import zlib

import numpy

from chainiter.errors import SnapshotMismatchError

# What numpy.load and reading a member raise on a file that is not a (whole)
# npz file.
READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile,
               zlib.error, KeyError, NotImplementedError)


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


def read_none(npz, key, error):
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
    except READ_ERRORS as e:
        raise damaged from e
    if dtype != object or shape != () or payload not in _NONE_PICKLES:
        raise damaged from error
    return numpy.asarray(None)
