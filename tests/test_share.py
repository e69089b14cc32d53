"""The pickling that takes large arrays out of a dataset into shared memory
(chainiter/iterators/multiprocess/share.py)."""

import io
import os

import numpy
import pytest

from chainiter.iterators.multiprocess import share

import helpers

pytestmark = pytest.mark.timeout(60)


# ---- the pickling, in one process ------------------------------------------

class _Descriptor:
    """Stands for multiprocessing's DupFd in a test without processes."""

    def __init__(self, fd):
        self.fd = fd

    def detach(self):
        return self.fd


def _round_trip(obj, arrays=None):
    """``obj`` as a worker gets it, and the pickle's size."""
    arrays = arrays or share.ArrayShare()
    data, blocks = arrays.dumps(obj)
    received = share.Received(data, {
        key: (shared.size, _Descriptor(os.dup(shared.fd)))
        for key, shared in blocks.items()})
    return received.load(), len(data), arrays


def test_large_arrays_leave_the_pickle():
    big = numpy.arange(2 ** 18, dtype=numpy.float64)         # 2 MiB
    strided = numpy.arange(2 ** 19, dtype=numpy.int32)[::2]  # 1 MiB
    fortran = numpy.asfortranarray(big.reshape(512, 512))
    objects = numpy.empty(2 ** 18, dtype=object)             # 2 MiB
    subclass = numpy.arange(2 ** 18, dtype=numpy.float64).view(
        numpy.recarray)
    obj = {'a': big, 'again': [big], 'strided': strided, 'f': fortran,
           'small': numpy.arange(3), 'objects': objects,
           'subclass': subclass}
    try:
        got, size, arrays = _round_trip(obj)
        assert got['a'] is got['again'][0]
        assert size < 4 * 2 ** 20      # only the object and subclass ones
        for key in ('a', 'strided', 'f'):
            numpy.testing.assert_array_equal(got[key], obj[key])
            assert not got[key].flags.writeable
            assert helpers.shared_mapping_of(got[key]) is not None
        assert got['f'].flags.f_contiguous
        assert got['small'].flags.writeable
        assert type(got['subclass']) is numpy.recarray
        assert got['subclass'].flags.writeable         # by value
        # A second pickling (a restarted worker) makes no new block.
        _, _, _ = _round_trip(obj, arrays)
        assert len(arrays._blocks) == 1
        del got
    finally:
        arrays.release()


def test_check_picklable_copies_no_array():
    out = io.BytesIO()
    share._Pickler(out, {}, 0).dump([numpy.zeros(2 ** 21)])
    assert len(out.getvalue()) < 1000
    # Arrays under the threshold are pickled (written without a copy).
    share.check_picklable([numpy.zeros(2 ** 16), numpy.zeros(2 ** 21)])
    with pytest.raises(TypeError):
        share.check_picklable(helpers.Unpicklable())
