"""Arrays that live in shared memory from the start (``shared_empty``,
``shared_copy``): spawned workers map their memory instead of getting a
copy.  ``lent_place`` finds the mapping an array views, and ``lent_view``
views it again in a worker (share.py passes it as a block of its own)."""

import collections
import mmap
import os
import weakref
from typing import Any, Dict, Literal, Sequence, Union

import numpy

from chainiter.iterators.pipeline.memory.shm import SharedBuffer

#: Where an array made by ``shared_empty`` lies in its mapping.
LentPlace = collections.namedtuple(
    'LentPlace', 'block offset dtype shape strides')

# The mappings of shared_empty's arrays: id(mmap) -> (weakref of the mmap,
# its descriptor, its size).  The descriptor is closed with the mapping.
lent: Dict[int, Any] = {}


def _forget(key, fd):
    lent.pop(key, None)
    os.close(fd)


def shared_empty(shape: Union[int, Sequence[int]], dtype: Any = float,
                 order: Literal['C', 'F'] = 'C') -> numpy.ndarray:
    """A new array, as ``numpy.empty`` (its values are zeros), in shared
    memory.

    MultiprocessIterator's workers, of every start method, then map this
    very memory instead of receiving a copy of the array: build a large
    dataset array here (or with ``shared_copy``) and the process tree holds
    it once under spawn and forkserver too.  Workers see it read-only, and
    see what the main process writes into it later.  The memory is freed
    with the last array that views it; nothing is left in ``/dev/shm``.
    """
    dtype = numpy.dtype(dtype)
    if dtype.hasobject:
        raise TypeError('shared_empty cannot hold Python objects (dtype '
                        '{}); use a numeric dtype'.format(dtype))
    shape = (int(shape),) if isinstance(shape, (int, numpy.integer)) else \
        tuple(int(n) for n in shape)
    nbytes = int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize
    shared = SharedBuffer.allocate(max(nbytes, 1))
    mapping, fd, size = shared.buffer, shared.fd, shared.size
    shared.fd = -1               # the mapping's finalizer closes it
    key = id(mapping)
    lent[key] = (weakref.ref(mapping), fd, size)
    weakref.finalize(mapping, _forget, key, fd)
    return numpy.ndarray(shape, dtype, buffer=mapping, order=order)


def shared_copy(array: Any) -> numpy.ndarray:
    """A copy of ``array`` in shared memory (see ``shared_empty``); drop
    the original to hold the data once."""
    array = numpy.asarray(array)
    out = shared_empty(array.shape, array.dtype,
                       'F' if array.flags.f_contiguous and
                       not array.flags.c_contiguous else 'C')
    out[...] = array
    return out


def lent_place(array):
    """``(mapping, fd, size, LentPlace without its block)`` of an array
    that views ``shared_empty``'s memory, or None."""
    base = array
    while isinstance(base, numpy.ndarray):
        base = base.base
    if not isinstance(base, mmap.mmap):
        return None
    found = lent.get(id(base))
    if found is None or found[0]() is not base:
        return None
    _, fd, size = found
    start = numpy.frombuffer(base, numpy.uint8).__array_interface__[
        'data'][0]
    offset = array.__array_interface__['data'][0] - start
    return base, fd, size, LentPlace(None, offset, array.dtype,
                                     array.shape, array.strides)


def lent_view(buffer, where):
    """The array at ``where`` (a ``LentPlace``) in ``buffer``."""
    return numpy.ndarray(where.shape, where.dtype, buffer=buffer,
                         offset=where.offset, strides=where.strides)
