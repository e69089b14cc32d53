"""Under spawn and forkserver the large arrays of a dataset reach the
workers as read-only shared memory (chainiter/iterators/multiprocess/
share.py); under fork nothing changes."""

import gc
import io
import os

import numpy
import pytest

import chainiter
from chainiter import MultiprocessIterator, SerialIterator
from chainiter.iterators.multiprocess import share

import helpers
from helpers import fingerprint, mapped_buffers, shm_files

pytestmark = pytest.mark.timeout(60)


def _batches(dataset, method, n, **kwargs):
    """``n`` batches from a MultiprocessIterator and from SerialIterator."""
    with MultiprocessIterator(dataset, 4, n_processes=2, seed=5,
                              start_method=method, **kwargs) as it:
        got = [next(it) for _ in range(n)]
    with SerialIterator(dataset, 4, seed=5) as ref:
        expected = [next(ref) for _ in range(n)]
    return got, expected


def _seen(batches):
    """What the loading processes saw (``BigArrays.seen``), once each."""
    return {example[-1] for batch in batches for example in batch}


def test_worker_sees_the_same_values(method):
    dataset = helpers.BigArrays()
    got, expected = _batches(dataset, method, 8)
    strip = [[example[:-1] for example in batch] for batch in got]
    assert [fingerprint(b) for b in strip] == \
        [fingerprint([e[:-1] for e in b]) for b in expected]
    writeable, aliased, fortran, big, row, small = _seen(got).pop()
    assert aliased and fortran        # one object, its order kept
    assert not small                  # under the threshold: by value
    if method == 'fork':
        assert (writeable, big, row) == (True, False, False)
    else:
        assert (writeable, big, row) == (False, True, True)


def test_arrays_are_mapped_from_shared_memory(method):
    # A test that fails when the arrays are pickled by value: in the
    # worker the big array lies in a mapping of an unlinked /dev/shm file
    # (by value it lies in anonymous memory, the heap).
    with MultiprocessIterator(helpers.BigArrays(8), 4, n_processes=1,
                              start_method=method) as it:
        example = next(it)[0]
    writeable, _, _, big, row, _ = example[-1]
    assert (big, row) == (method != 'fork',) * 2
    assert writeable == (method == 'fork')


def test_writing_in_the_worker_raises(method):
    with MultiprocessIterator(helpers.WritesBigArray(8), 4, n_processes=2,
                              start_method=method) as it:
        outcomes = set(next(it))
    if method == 'fork':
        assert outcomes == {('wrote', '')}      # its copy-on-write page
    else:
        assert outcomes == {('ValueError',
                             'assignment destination is read-only')}


@pytest.mark.parametrize('how', ['finalize', 'with', 'gc'])
def test_nothing_left_behind(method, how):
    files, buffers = shm_files(), mapped_buffers()
    it = MultiprocessIterator(helpers.BigArrays(), 4, n_processes=2,
                              start_method=method)
    next(it)
    pids = helpers.worker_pids()
    assert pids
    if how == 'finalize':
        it.finalize()
    elif how == 'with':
        with it:
            next(it)
    else:
        del it
        gc.collect()
    assert helpers.wait_processes_gone(pids, timeout=10)
    assert shm_files() <= files
    assert mapped_buffers() == buffers


def test_restart_after_a_worker_death(method, tmp_path):
    dataset = helpers.BigKillsOnce(16, bad=9, directory=str(tmp_path))
    with pytest.warns(chainiter.WorkerRestartWarning, match='signal 9'):
        got, expected = _batches(dataset, method, 8)
    assert os.path.exists(str(tmp_path / 'killed'))
    strip = [[example[:-1] for example in batch] for batch in got]
    assert [fingerprint(b) for b in strip] == \
        [fingerprint([e[:-1] for e in b]) for b in expected]
    # The replacement got the arrays through shared memory too.
    assert {seen[3] for seen in _seen(got)} == {method != 'fork'}


def test_memmap_is_mapped_from_its_file(method, tmp_path):
    path = str(tmp_path / 'data.bin')
    dataset = helpers.MappedFile(path)
    with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              start_method=method) as it:
        batch = next(it)
    assert [int(row[0]) for row, _, _ in batch] == [8, 9, 10, 11]
    assert {where for _, where, _ in batch} == {path}
    assert {writeable for _, _, writeable in batch} == {method == 'fork'}


def test_arrays_made_in_shared_memory_are_not_copied(method):
    # The workers map the very memory of chainiter.shared_copy's and
    # shared_empty's arrays (the same unlinked file), small ones too: the
    # process tree holds them once.
    dataset = helpers.LentArrays()
    got, expected = _batches(dataset, method, 4)
    strip = [[example[:-1] for example in batch] for batch in got]
    assert [fingerprint(b) for b in strip] == \
        [fingerprint([e[:-1] for e in b]) for b in expected]
    big, strided, small, writeable = dataset.where()
    assert big and strided and small and len({big, strided, small}) == 3
    assert _seen(got) == {(big, strided, small, method == 'fork')}


def test_arrays_made_in_shared_memory_leave_nothing_behind(method):
    gc.collect()        # earlier tests' arrays
    files, buffers = shm_files(), mapped_buffers()
    dataset = helpers.LentArrays()
    assert mapped_buffers() != buffers
    with MultiprocessIterator(dataset, 4, n_processes=2,
                              start_method=method) as it:
        next(it)
        pids = helpers.worker_pids()
    assert helpers.wait_processes_gone(pids, timeout=10)
    del dataset, it
    gc.collect()
    assert shm_files() <= files
    assert mapped_buffers() == buffers


def test_shared_copy_is_a_copy_in_shared_memory():
    from helpers import shared_mapping_of
    for array in (numpy.arange(12.).reshape(3, 4), numpy.zeros((0, 3)),
                  numpy.asfortranarray(numpy.ones((5, 6), numpy.int16)),
                  numpy.arange(10)[::3], numpy.float32(2.5)):
        copy = chainiter.shared_copy(array)
        assert type(copy) is numpy.ndarray and copy.dtype == array.dtype
        assert copy.shape == numpy.shape(array)
        assert numpy.array_equal(copy, array)
        assert copy.flags.writeable
        if copy.size:
            assert shared_mapping_of(copy) is not None
            flags = numpy.asarray(array).flags
            fortran = flags.f_contiguous and not flags.c_contiguous
            assert copy.flags.f_contiguous if fortran else \
                copy.flags.c_contiguous
    empty = chainiter.shared_empty(5, 'u1')
    assert empty.shape == (5,) and not empty.any()
    with pytest.raises(TypeError, match='numeric dtype'):
        chainiter.shared_empty(3, object)


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


def _big_array_in(function):
    """The array a function reaches: its closure's, or one of its
    globals'."""
    for cell in function.__closure__ or ():
        if isinstance(cell.cell_contents, numpy.ndarray):
            return cell.cell_contents
    return function.__globals__['BIG_GLOBAL']


BIG_GLOBAL = numpy.arange(2 ** 18, dtype=numpy.float64)


def test_what_goes_by_value_keeps_its_large_arrays_shared():
    # A lambda and a closure go by value (cloudpickle), and the large
    # arrays they reach still leave the pickle: a closure's cell, the
    # globals of a function the workers cannot import.
    pytest.importorskip('cloudpickle')
    big = numpy.arange(2 ** 18, dtype=numpy.float64)           # 2 MiB
    closure = lambda i: big[i]                                  # NOQA: E731
    uses_global = lambda i: BIG_GLOBAL[i] + 1                   # NOQA: E731
    try:
        (got_closure, got_global), size, arrays = _round_trip(
            (closure, uses_global))
        assert size < 2 ** 16
        assert (got_closure(5), got_global(5)) == (5.0, 6.0)
        for function in (got_closure, got_global):
            array = _big_array_in(function)
            assert not array.flags.writeable
            assert helpers.shared_mapping_of(array) is not None
        del got_closure, got_global, function, array
    finally:
        arrays.release()
