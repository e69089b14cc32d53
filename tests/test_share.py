"""Under spawn and forkserver the large arrays of a dataset reach the
workers as read-only shared memory (chainiter/iterators/pipeline/
share.py); under fork nothing changes."""

import gc
import io
import os

import numpy
import pytest

import chainiter
from chainiter import MultiprocessIterator, SerialIterator
from chainiter.iterators.pipeline.processes import array_pickle, share

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


def test_workers_read_the_arrays_only_once_they_are_copied(method):
    # The first workers start while the arrays are being copied into
    # shared memory; a dataset that reads them as it is unpickled must
    # still see every value (a forkserver worker starts in milliseconds,
    # the copy of 1 GiB half a second: without the wait both spawn and
    # forkserver fail here).
    if method == 'fork':
        pytest.skip('forked workers share the memory: nothing is copied')
    dataset = helpers.ReadsArrayWhenUnpickled(1024)
    with MultiprocessIterator(dataset, 4, n_processes=2,
                              start_method=method) as it:
        seen = next(it) + next(it)
    assert seen == [dataset.total] * 8
    assert not shm_files()


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


def _round_trip(obj=None, arrays=None):
    """``obj`` as a worker gets it (or what ``arrays`` holds), the
    pickle's size, and the share."""
    arrays = arrays or share.ArrayShare(obj)
    data, blocks = arrays.pickled()
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
        # A restarted worker gets the same bytes and blocks.
        assert arrays.pickled() == arrays.pickled()
        again, _, _ = _round_trip(arrays=arrays)
        assert again['a'] is again['again'][0]
        numpy.testing.assert_array_equal(again['a'], obj['a'])
        del got, again
    finally:
        arrays.release()


def test_check_picklable_copies_no_array():
    out = io.BytesIO()
    array_pickle.Pickler(out, 0).dump([numpy.zeros(2 ** 21)])
    assert len(out.getvalue()) < 1000
    # Arrays under the threshold are pickled (written without a copy).
    array_pickle.check_picklable([numpy.zeros(2 ** 16), numpy.zeros(2 ** 21)])
    with pytest.raises(TypeError):
        array_pickle.check_picklable(helpers.Unpicklable())


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


# ---- the main process's arrays are never touched ---------------------------

def _shared(array):
    """Whether any of ``array``'s first, middle or last bytes lie in a
    shared-memory file (rather than the process's private memory)."""
    flat = array.reshape(-1, order='A')
    for part in (flat[:1], flat[flat.size // 2:], flat[-1:]):
        path = helpers.shared_mapping_of(part)
        if path is not None and path.startswith('/dev/shm/'):
            return True
    return False


def _values(batch):
    """A batch of BigArrays without what the loading process saw."""
    return fingerprint([example[:-1] for example in batch])


def test_the_main_process_arrays_stay_private_and_unchanged(method):
    # While the workers run, restart (maxtasksperchild) and close, the
    # dataset's arrays in the main process stay its private memory, with
    # exactly what the main thread wrote into them between next() calls;
    # the workers see them as they were when the iterator started.
    gc.collect()
    buffers = mapped_buffers()
    dataset = helpers.BigArrays()
    reference = SerialIterator(helpers.BigArrays(), 4, seed=5)
    with MultiprocessIterator(dataset, 4, n_processes=1, seed=5,
                              maxtasksperchild=1, start_method=method) as it:
        for k in range(6):
            dataset.big[:] = k
            dataset.fortran[...] = -k
            assert _values(next(it)) == _values(next(reference)), k
            for array in (dataset.big, dataset.fortran, dataset.strided):
                assert not _shared(array), k
            assert (dataset.big == k).all() and (dataset.fortran == -k).all()
        assert dataset.big.flags.writeable
    assert not _shared(dataset.big) and (dataset.big == 5).all()
    gc.collect()
    assert mapped_buffers() == buffers
    assert not shm_files()


def test_arrays_are_copied_and_the_originals_stay_put():
    big = numpy.arange(2 ** 20, dtype=numpy.float64)          # 8 MiB
    view = numpy.arange(2 ** 20, dtype=numpy.int64)[1000:]    # a view: too
    small = numpy.arange(2 ** 17 - 1, dtype=numpy.float64)   # by value
    address = big.__array_interface__['data'][0]
    got, _, arrays = _round_trip({'big': big, 'view': view, 'small': small})
    try:
        assert not _shared(big) and not _shared(view)
        assert big.__array_interface__['data'][0] == address
        numpy.testing.assert_array_equal(got['big'], big)
        numpy.testing.assert_array_equal(got['view'], view)
        big[:] = 3.0                  # the main process's writes are its own
        assert (got['big'] == numpy.arange(2 ** 20)).all()
    finally:
        arrays.release()
    assert (big == 3.0).all()
    numpy.testing.assert_array_equal(view, numpy.arange(1000, 2 ** 20))


def test_iterators_collected_by_the_gc_during_construction(method):
    # Iterators dropped in reference cycles are finalized by whichever
    # garbage collection pass comes first: often inside the next
    # iterator's constructor, while it copies the dataset's arrays and
    # starts workers.  Nothing waits for anything there.
    dataset = helpers.ReadsArrayWhenUnpickled(8)
    threshold = gc.get_threshold()
    gc.collect()
    gc.set_threshold(20)          # a pass every few allocations
    try:
        for _ in range(4):
            it = MultiprocessIterator(dataset, 4, n_processes=1,
                                      start_method=method)
            cycle = [it]
            cycle.append(cycle)
            assert next(it) == [dataset.total] * 4
            del it, cycle
    finally:
        gc.set_threshold(*threshold)
    gc.collect()
    assert helpers.wait_processes_gone(helpers.worker_pids(), 30)
    assert not shm_files()


def _write_and_report(array, queue):
    array[:] = -1.0
    queue.put(float(array.sum()))


def test_a_forked_child_never_writes_into_the_parent_or_the_workers(method):
    # A process forked while the workers run (another iterator's fork
    # workers, subprocess with preexec_fn) writes into its own copy: the
    # main process's array and what the workers read stay as they were.
    import multiprocessing
    dataset = helpers.BigArrays()
    reference = SerialIterator(helpers.BigArrays(), 4, seed=5)
    with MultiprocessIterator(dataset, 4, n_processes=2, seed=5,
                              start_method=method) as it:
        assert _values(next(it)) == _values(next(reference))
        ctx = multiprocessing.get_context('fork')
        queue = ctx.SimpleQueue()
        child = ctx.Process(target=_write_and_report,
                            args=(dataset.big, queue))
        child.start()
        assert queue.get() == -float(dataset.big.size)
        child.join(timeout=30)
        assert child.exitcode == 0
        numpy.testing.assert_array_equal(
            dataset.big, numpy.arange(dataset.big.size))
        for _ in range(8):
            assert _values(next(it)) == _values(next(reference))


def _private_bytes():
    """Bytes of this process's private memory (its own pages)."""
    total = 0
    with open('/proc/self/smaps_rollup') as f:
        for line in f:
            if line.startswith(('Private_Clean:', 'Private_Dirty:')):
                total += int(line.split()[1]) * 1024
    return total


@pytest.mark.skipif(not os.path.exists('/proc/self/smaps_rollup'),
                    reason='needs /proc/self/smaps_rollup')
def test_a_fork_holds_no_more_memory_than_before(method):
    # A fork neither copies the dataset's arrays in the main process nor
    # leaves a block behind: the main process's memory and the shared
    # memory it maps are what they were before the fork.
    dataset = helpers.ReadsArrayWhenUnpickled(32)
    with MultiprocessIterator(dataset, 4, n_processes=1,
                              start_method=method) as it:
        assert next(it) == [dataset.total] * 4
        before = _private_bytes(), helpers.shm_mapped_bytes()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        after = _private_bytes(), helpers.shm_mapped_bytes()
        assert after[0] < before[0] + 8 * 2 ** 20, (before, after)
        assert after[1] <= before[1], (before, after)
        assert next(it) == [dataset.total] * 4


_SHORT_OF_ADDRESS_SPACE = r"""
import os, resource, sys
sys.path.insert(0, {tests!r})
import numpy, chainiter, helpers


def main():
    dataset = helpers.ReadsArrayWhenUnpickled(16)
    expected = dataset.data.copy()
    with chainiter.MultiprocessIterator(
            dataset, 4, n_processes=1, start_method={method!r}) as it:
        assert next(it) == [dataset.total] * 4
        # No address space left beyond what is in use, then a fork.
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open('/proc/self/statm') as f:
            used = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + 2 ** 20, hard))
        pid = os.fork()
        if pid == 0:
            dataset.data[:] = -1.0
            os._exit(0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        assert os.waitpid(pid, 0)[1] == 0
        assert (dataset.data == expected).all(), 'the child wrote here'
        assert next(it) == [dataset.total] * 4, 'the workers saw it'
    print('ok')


if __name__ == '__main__':
    main()
"""


def test_a_fork_short_of_address_space_leaves_the_parent_alone(
        method, tmp_path):
    import subprocess
    import sys
    script = tmp_path / 'script.py'
    script.write_text(_SHORT_OF_ADDRESS_SPACE.format(
        tests=os.path.dirname(__file__), method=method))
    done = subprocess.run([sys.executable, str(script)],
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == 'ok'


def test_a_large_copy_warns_once_naming_the_ways_to_hold_it_once(
        method, monkeypatch):
    # Past the threshold, once per iterator however many workers start
    # (maxtasksperchild); under fork nothing is copied: no warning.
    import warnings
    monkeypatch.setattr(share, 'COPY_WARN_BYTES', 2 ** 20)
    dataset = helpers.ReadsArrayWhenUnpickled(4)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        with MultiprocessIterator(dataset, 4, n_processes=1,
                                  maxtasksperchild=1,
                                  start_method=method) as it:
            for _ in range(3):
                assert next(it) == [dataset.total] * 4
    messages = [str(w.message) for w in record]
    assert all(w.category is chainiter.SharedMemoryWarning for w in record)
    assert len(messages) == (0 if method == 'fork' else 1), messages
    for message in messages:
        for way in ('shared_copy', 'shared_empty', "mmap_mode='r'",
                    "start_method='fork'"):
            assert way in message


def test_no_warning_below_the_threshold(method):
    import warnings
    dataset = helpers.ReadsArrayWhenUnpickled(4)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with MultiprocessIterator(dataset, 4, n_processes=2,
                                  start_method=method) as it:
            assert next(it) == [dataset.total] * 4


SMALL_SHM_SCRIPT = '''
import sys, warnings
sys.path.insert(0, {tests!r})
import chainiter, helpers


def main():
    dataset = helpers.ReadsArrayWhenUnpickled(4)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        with chainiter.MultiprocessIterator(
                dataset, 4, n_processes=2, start_method={method!r}) as it:
            seen = next(it) + next(it)
    print('OK' if seen == [dataset.total] * 8 else 'WRONG', seen)
    for w in record:
        print('WARNING', w.category.__name__, w.message)


if __name__ == '__main__':
    main()
'''


def test_arrays_go_to_the_temporary_directory_when_dev_shm_is_small(
        method, tmp_path):
    # /dev/shm of 1 MiB cannot take the 4 MiB array: its block goes to
    # TMPDIR, with a warning that says so, and the workers see the values.
    if method == 'fork':
        pytest.skip('forked workers share the memory: no block')
    script = tmp_path / 'script.py'
    script.write_text(SMALL_SHM_SCRIPT.format(
        tests=os.path.dirname(__file__), method=method))
    tmp = tmp_path / 'tmp'
    tmp.mkdir()
    out = helpers.run_with_dev_shm(script, '1M', tmp, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 'OK' in out.stdout, out.stdout + out.stderr
    assert 'WARNING SharedMemoryWarning' in out.stdout
    assert '/dev/shm' in out.stdout and str(tmp) in out.stdout
    assert os.listdir(tmp) == []


# ---- one dataset for the pool's life ----------------------------------------

BEFORE = ('before', 0.0, 0.0, 0.0)


def test_workers_started_later_see_the_dataset_as_the_first_did(method):
    # Replacements (maxtasksperchild=1: every batch a new worker) started
    # after the main process changed the dataset see it as the first
    # workers did: attributes, small arrays and large ones alike.
    # A budget that holds no more than the fewest batches in flight (2
    # per worker): few batches in flight at the write.
    dataset = helpers.LaterWrites()
    with MultiprocessIterator(dataset, 4, n_processes=2, prefetch_bytes=1,
                              maxtasksperchild=1, shuffle=False,
                              start_method=method) as it:
        before = [e for _ in range(2) for e in next(it)]
        dataset.write()
        alive = helpers.worker_pids()
        after = [e for _ in range(16) for e in next(it)]
        depth = it.stats['prefetch']
    assert depth == 4
    assert {e[2] for e in before + after} == {BEFORE}
    assert [e[0] for e in after] == [(8 + j) % 16 for j in range(64)]
    # A worker neither alive at the write nor seen before it loaded one of
    # the batches in flight then (at most ``depth``: one task each), or
    # started after the write.
    fresh = {e[1] for e in after} - alive - {e[1] for e in before}
    assert len(fresh) > depth


def test_reset_keeps_the_workers_dataset_and_a_copy_takes_the_new_one(
        method):
    # reset() keeps the pool, so its workers (replacements too) keep the
    # dataset they had; a copy starts its own workers, with the dataset
    # as it is then.
    import copy
    dataset = helpers.LaterWrites()
    with MultiprocessIterator(dataset, 4, n_processes=1, n_prefetch=1,
                              maxtasksperchild=1, shuffle=False,
                              start_method=method) as it:
        next(it)
        dataset.write()
        it.reset()
        kept = {e[2] for _ in range(3) for e in next(it)}
        with copy.copy(it) as other:
            taken = {e[2] for _ in range(3) for e in next(other)}
    assert kept == {BEFORE}
    assert taken == {('after', 1.0, 1.0, 1.0)}


def test_replacing_a_large_array_holds_no_more_shared_memory(method):
    # A program that replaces a large array of its dataset now and then
    # (a curriculum, a refreshed cache) while workers are replaced: the
    # shared memory held stays flat, and the arrays it dropped are freed.
    import weakref
    dataset = helpers.LaterWrites()
    with MultiprocessIterator(dataset, 4, n_processes=2, n_prefetch=2,
                              maxtasksperchild=1, shuffle=False,
                              start_method=method) as it:
        for _ in range(6):
            next(it)
        held = helpers.shared_bytes()
        dropped = []
        # Each replacement worker copies the arrays anew: a copy that
        # stayed held would show after the first few.
        for k in range(10):
            dropped.append(weakref.ref(dataset.replaced))
            dataset.replace(k)
            assert {e[2] for e in next(it)} == {BEFORE}
        gc.collect()
        assert helpers.shared_bytes() == held
        assert [ref() for ref in dropped] == [None] * 10
