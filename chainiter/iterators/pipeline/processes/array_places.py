"""Where a large array of the dataset lies for the workers, pure: at a
``Place`` in a block of shared memory (``place``, then ``view`` in the
worker), or at a ``FilePlace`` in the named file of a ``numpy.memmap``
(``file_place``, ``file_view``); ``shareable`` says which arrays travel
so (see share.py)."""

import collections
import mmap
import os

import numpy

#: Arrays of at least this many bytes travel as shared memory.
SHARE_MIN_BYTES = 2 ** 20

#: Where each array starts in a block: a multiple of this many bytes.
ALIGN_BYTES = 64

try:
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:         # numpy < 2.0
    _byte_bounds = numpy.byte_bounds  # type: ignore[attr-defined]


#: Where an array lies in block ``block``, and how to view it.
Place = collections.namedtuple('Place', 'block offset dtype shape order')

#: Where an array lies in a file: ``view`` of ``span`` bytes at ``offset``.
FilePlace = collections.namedtuple(
    'FilePlace', 'filename offset span start dtype shape strides')


def shareable(obj):
    """Whether ``obj`` travels as shared memory (see share.py)."""
    return type(obj) in (numpy.ndarray, numpy.memmap) and \
        not obj.dtype.hasobject and obj.nbytes >= SHARE_MIN_BYTES


def place(array, block, offset):
    """The ``Place`` of ``array`` in ``block`` at the first offset from
    ``offset`` that is a multiple of ``ALIGN_BYTES``, and the offset after
    it."""
    offset = -(-offset // ALIGN_BYTES) * ALIGN_BYTES
    order = 'F' if array.flags.f_contiguous and \
        not array.flags.c_contiguous else 'C'
    return (Place(block, offset, array.dtype, array.shape, order),
            offset + array.nbytes)


def view(buffer, where):
    """The array at ``where`` (a ``Place``) in ``buffer``."""
    return numpy.ndarray(where.shape, where.dtype, buffer=buffer,
                         offset=where.offset, order=where.order)


def file_place(array):
    """The ``FilePlace`` of an array that views a ``numpy.memmap`` of a
    named file mapped shared (not copy-on-write), or None."""
    base = array
    while isinstance(base, numpy.ndarray) and \
            not isinstance(base.base, mmap.mmap):
        base = base.base
    if not isinstance(base, numpy.memmap) or base.mode == 'c' or \
            not base.filename or not os.path.exists(base.filename):
        return None
    low, high = _byte_bounds(array)
    data = array.__array_interface__['data'][0]
    return FilePlace(base.filename,
                     base.offset + low - base.__array_interface__['data'][0],
                     high - low, data - low, array.dtype, array.shape,
                     array.strides)


def file_view(where):
    """The array at ``where`` (a ``FilePlace``), mapped read-only."""
    mapped = numpy.memmap(where.filename, dtype=numpy.uint8, mode='r',
                          offset=where.offset, shape=(where.span,))
    return numpy.ndarray(where.shape, where.dtype, buffer=mapped,
                         offset=where.start, strides=where.strides)
