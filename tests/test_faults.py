"""Fault injection: every fault ends in the right batches or a clear error,
promptly, with no process and no shared-memory file left behind."""

import errno
import functools
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

import chainiter
from chainiter import MultiprocessIterator, SerialIterator

import helpers
from helpers import (
    Faulty,
    fingerprint,
    shm_files,
    wait_for_file,
    wait_processes_gone,
    worker_pids,
)

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def run_script(tmp_path, template, timeout=90, **fields):
    """Run ``template`` (formatted with ``tests`` and ``fields``) in a child
    Python; its result, after checking that it printed OK and exited 0."""
    script = tmp_path / 'child.py'
    script.write_text(template.format(tests=TESTS_DIR, **fields))
    child = subprocess.run([sys.executable, str(script)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=timeout)
    assert child.returncode == 0, child.stderr
    assert 'OK' in child.stdout
    return child


def run_two_epochs(dataset, method, **kwargs):
    """Both epochs from a MultiprocessIterator and from SerialIterator."""
    with MultiprocessIterator(dataset, 4, n_processes=2, seed=3,
                              start_method=method, **kwargs) as it, \
            SerialIterator(dataset, 4, seed=3) as ref:
        n = 2 * len(dataset) // 4
        return ([fingerprint(next(it)) for _ in range(n)],
                [fingerprint(next(ref)) for _ in range(n)])


def test_deliberate_segv_prints_no_fatal_error_dump():
    # pytest's faulthandler writes to the terminal past any capture, so a
    # dump from a crashing worker would land in a passing run's output.
    tests = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(tests)
    child = subprocess.run(
        [sys.executable, '-X', 'faulthandler', '-c',
         'import helpers; helpers.Faulty(1, 0, "sigsegv")[0]'],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([tests, root])),
        capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGSEGV, child.stderr
    assert 'Fatal Python error' not in child.stderr


@pytest.mark.parametrize('fault,how', [
    ('exit', 'exit code 7'), ('sigkill', 'signal 9'),
    ('sigsegv', 'signal 11')])
def test_dead_worker_is_replaced_and_nothing_is_lost(method,
                                                     fault, how,
                                                     tmp_path, capfd):
    dataset = Faulty(20, bad=13, fault=fault,
                     once_file=str(tmp_path / 'happened'))
    with pytest.warns(chainiter.WorkerRestartWarning, match=how) as record:
        got, expected = run_two_epochs(dataset, method)
    assert got == expected
    message = str(record[0].message)
    assert 'pid' in message
    if fault == 'sigkill':
        assert 'OOM killer' in message
    assert 'Traceback' not in capfd.readouterr().err


def test_death_is_detected_within_seconds(method, tmp_path):
    dataset = Faulty(8, bad=5, fault='sigkill',
                     once_file=str(tmp_path / 'happened'))
    with MultiprocessIterator(dataset, 4, n_processes=1, shuffle=False,
                              start_method=method) as it:
        next(it)
        start = time.monotonic()
        with pytest.warns(chainiter.WorkerRestartWarning):
            batch = next(it)
        elapsed = time.monotonic() - start
    assert [int(x[0]) for x in batch] == [4, 5, 6, 7]
    # Not a speed figure: a dead worker noticed by polling or by a
    # timeout would take far longer than this bound.
    assert elapsed < 5, elapsed


def test_death_while_finished_batches_wait_for_the_consumer(method,
                                                            tmp_path):
    # Deep prefetch and an idle consumer: finished batches pile up and the
    # receiver thread rests, yet it notices the death within seconds (a
    # new worker starts).  Nothing may be lost, duplicated or reordered.
    once = str(tmp_path / 'happened')
    dataset = Faulty(24, bad=5, fault='sigkill', once_file=once)
    with MultiprocessIterator(dataset, 1, n_processes=2, n_prefetch=8,
                              shuffle=False, start_method=method) as it:
        # The workers before any could load example 5 (next() sends it).
        first = worker_pids()
        assert int(next(it)[0][0]) == 0
        assert wait_for_file(once, timeout=30)
        deadline = time.monotonic() + 10
        while not worker_pids() - first:
            assert time.monotonic() < deadline, 'the death went unnoticed'
            time.sleep(0.01)   # polling with a deadline
        with pytest.warns(chainiter.WorkerRestartWarning, match='signal 9'):
            got = [int(next(it)[0][0]) for _ in range(47)]
    assert got == list(range(1, 24)) + list(range(24))


class LargeBatches(Faulty):
    """Example i is 100 bytes naming i (no arrays: batches travel through
    the pipe); loading example ``bad`` kills the worker, once."""

    def __init__(self, n, bad, once_file):
        super().__init__(n, bad, 'sigkill', once_file)

    def __getitem__(self, i):
        super().__getitem__(i)     # the kill
        return str(i).encode().ljust(100)


LARGE_SCRIPT = '''
import sys, warnings
sys.path.insert(0, {tests!r})
import chainiter, test_faults


def main():
    # The dead worker's tasks (20,000 indices each) go to its replacement,
    # whose results (2 MB each) only the receiver thread reads: that thread
    # must not be the one waiting to send the tasks.
    dataset = test_faults.LargeBatches(100000, 50000, {once!r})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        with chainiter.MultiprocessIterator(
                dataset, 20000, n_processes=1, n_prefetch=8, shuffle=False,
                start_method={method!r}) as it:
            for step in range(10):
                batch = next(it)
                start = step % 5 * 20000
                assert batch[0] == str(start).encode().ljust(100)
                assert len(batch) == 20000
    print('OK')
    for w in record:
        print('WARNING', w.category.__name__, w.message)


if __name__ == '__main__':
    main()
'''


def test_death_with_large_tasks_and_results(method, tmp_path):
    # In a child with a deadline: with sends that can block (the receiver
    # thread writing the replacement's tasks while that worker waits for it
    # to read a result) it hangs, and the deadline makes that a failure.
    try:
        child = run_script(tmp_path, LARGE_SCRIPT, timeout=60, method=method,
                           once=str(tmp_path / 'happened'))
    except subprocess.TimeoutExpired:
        pytest.fail('a worker death with large tasks hung the iterator')
    assert 'WorkerRestartWarning' in child.stdout and 'signal 9' in \
        child.stdout


def test_deaths_count_against_the_batch_being_loaded(method, tmp_path):
    # Three deaths, each while loading another batch, with deep prefetch:
    # every batch in flight was queued to the dying worker, but none of
    # them killed three workers, so none fails.
    # (Counted against every batch queued, batch 3 would have three.)
    dataset = helpers.KillsOnceEach(24, [6, 10, 14], str(tmp_path))
    with MultiprocessIterator(dataset, 4, n_processes=1, n_prefetch=4,
                              shuffle=False, start_method=method) as it:
        with pytest.warns(chainiter.WorkerRestartWarning):
            got = [[int(x[0]) for x in next(it)] for _ in range(6)]
    assert got == [list(range(4 * k, 4 * k + 4)) for k in range(6)]


def test_batch_that_keeps_killing_workers_raises(method):
    dataset = Faulty(12, bad=6, fault='sigkill')
    with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              start_method=method) as it:
        assert [int(x[0]) for x in next(it)] == [0, 1, 2, 3]
        with pytest.warns(chainiter.WorkerRestartWarning):
            with pytest.raises(chainiter.WorkerDiedError) as info:
                next(it)
        message = str(info.value)
        assert '6' in message and 'signal 9' in message and 'pid' in message
        assert (it.epoch, it.current_position) == (0, 4)
        with pytest.warns(chainiter.WorkerRestartWarning):
            with pytest.raises(chainiter.WorkerDiedError):
                next(it)               # still the same batch
        assert it.current_position == 4


def test_exception_in_dataset(method):
    dataset = Faulty(12, bad=6, fault='raise')
    with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              start_method=method) as it:
        next(it)
        with pytest.raises(ValueError, match='bad example 6') as info:
            next(it)
        assert isinstance(info.value.__cause__, Exception)
        assert 'Faulty' in str(info.value.__cause__) or \
            '__getitem__' in str(info.value.__cause__)
        assert it.current_position == 4


@pytest.mark.parametrize('fault,message', [
    ('unpicklable-example', r'example of dataset\[6\] cannot be pickled'),
    ('unpicklable-field', r'example of dataset\[6\] cannot be pickled'),
    ('unpicklable-error',
     r'UnpicklableError: bad example 6.*dataset\[6\].*could not be pickled'),
    ('fails-to-unpickle', r'indices \[.*6.*\].*cannot be unpickled'),
])
def test_results_that_cannot_travel(method, fault, message):
    dataset = Faulty(12, bad=6, fault=fault)
    with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              start_method=method) as it:
        next(it)
        with pytest.raises(chainiter.ChainiterError, match=message):
            next(it)
        assert it.current_position == 4


def test_stuck_worker_does_not_stop_finalize(method, tmp_path):
    marker = str(tmp_path / 'stuck')
    dataset = Faulty(8, bad=1, fault='stuck', once_file=marker)
    others = set(_child_pids())      # e.g. a forkserver from other tests
    it = MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              start_method=method)
    assert wait_for_file(marker + '.stuck', timeout=60)
    pids = set(_child_pids()) - others
    start = time.monotonic()
    it.finalize()
    assert time.monotonic() - start < 5
    assert wait_processes_gone(pids, timeout=5)


def _child_pids():
    return _children_of(os.getpid())


CHILD = '''
import signal, sys
sys.path.insert(0, {tests!r})
import chainiter, helpers

if __name__ == '__main__':
    # A program started from a terminal, where Ctrl-C raises
    # KeyboardInterrupt; a test run started in the background (nohup, &)
    # hands its children SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    it = chainiter.MultiprocessIterator(
        helpers.Pids(), 2, n_processes=2, start_method={method!r})
    pids = set()
    for _ in range(6):
        pids |= {{e[1] for e in next(it)}}
    print(' '.join(map(str, sorted(pids))), flush=True)
    it = chainiter.MultiprocessIterator(
        helpers.Stalling(10, slow=3, seconds=600), 2, n_processes=2,
        shuffle=False, dataset_timeout=None, start_method={method!r})
    next(it)
    print('waiting', flush=True)
    next(it)     # stalls for good
'''


def start_child(method, tmp_path):
    script = tmp_path / 'child.py'
    script.write_text(CHILD.format(tests=TESTS_DIR, method=method))
    child = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pids = [int(p) for p in child.stdout.readline().split()]
        assert child.stdout.readline().strip() == 'waiting'
    except BaseException:
        child.kill()
        child.communicate()
        raise
    return child, pids


def test_ctrl_c_interrupts_promptly(method, tmp_path):
    before = shm_files()
    child, pids = start_child(method, tmp_path)
    start = time.monotonic()
    os.killpg(child.pid, signal.SIGINT)        # as a terminal's Ctrl-C
    _, stderr = child.communicate(timeout=30)
    elapsed = time.monotonic() - start
    assert 'KeyboardInterrupt' in stderr, stderr
    assert stderr.count('Traceback') == 1, stderr   # none from workers
    assert elapsed < 5, (elapsed, stderr)
    assert wait_processes_gone(pids, timeout=5)
    assert shm_files() <= before


def test_workers_exit_when_main_process_is_killed(method, tmp_path):
    before = shm_files()
    child, pids = start_child(method, tmp_path)
    worker_pids = [p for p in _children_of(child.pid)]
    child.kill()
    child.communicate(timeout=30)
    assert wait_processes_gone(pids + worker_pids, timeout=5)
    assert shm_files() <= before


def _children_of(pid):
    out = []
    for task in os.listdir('/proc/{}/task'.format(pid)):
        try:
            with open('/proc/{}/task/{}/children'.format(pid, task)) as f:
                out.extend(int(p) for p in f.read().split())
        except OSError:
            pass
    return out


FILL_SCRIPT = '''
import os, sys, warnings
sys.path.insert(0, {tests!r})
import numpy, chainiter, helpers


def main():
    # 8 small examples, then large ones: the buffers sized from the first
    # batch must grow while /dev/shm has been filled by someone else.
    dataset = helpers.Big(24, sizes=[100] * 8 + [20000] * 16)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        it = chainiter.MultiprocessIterator(
            dataset, 4, n_processes=2, shuffle=False,
            start_method={method!r})
        ref = chainiter.SerialIterator(dataset, 4, shuffle=False)
        next(it), next(ref)
        # All the room left, while the workers may still be reserving
        # their slots: written until the file system refuses.
        fd = os.open('/dev/shm/filler', os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b'x' * 4096):
                pass
        except OSError:
            pass
        os.close(fd)
        for _ in range(10):
            assert helpers.fingerprint(next(it)) == \\
                helpers.fingerprint(next(ref))
        it.finalize()
    print('OK')
    for w in record:
        print('WARNING', w.category.__name__, w.message)


if __name__ == '__main__':
    main()
'''


SMALL_DEV_SHM_SCRIPT = '''
import sys, warnings
sys.path.insert(0, {tests!r})
import chainiter, helpers


def main():
    # Slots of 1.5 MiB, 6 of them, in a /dev/shm of 4 MiB (as Docker's
    # 64 MiB for batches of 38 MB): the slots that do not fit go to TMPDIR,
    # although none has taken its room yet when the next is made.
    if {reserve_when_measured!r}:
        helpers.reserve_when_measured()
    dataset = helpers.Big(96, sizes=[49152])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        it = chainiter.MultiprocessIterator(
            dataset, 4, n_processes=2, n_prefetch=4, seed=3,
            start_method={method!r})
        ref = chainiter.SerialIterator(dataset, 4, seed=3)
        for _ in range({n_batches}):
            assert helpers.fingerprint(next(it)) == \\
                helpers.fingerprint(next(ref))
        print('BY_COPY', it.stats['by_copy'])
        it.finalize()
    print('OK')
    for w in record:
        print('WARNING', w.category.__name__, w.message)


if __name__ == '__main__':
    main()
'''


@pytest.mark.parametrize('size', ['4M', '0'])
def test_slots_that_do_not_fit_dev_shm_go_to_the_temporary_directory(
        method, tmp_path, size):
    # size=0: a tmpfs without a limit (statvfs says 0 bytes free): every
    # slot stays in /dev/shm.
    script = tmp_path / 'small.py'
    script.write_text(SMALL_DEV_SHM_SCRIPT.format(
        tests=TESTS_DIR, method=method, n_batches=48,
        reserve_when_measured=False))
    tmp = tmp_path / 'tmp'
    tmp.mkdir()
    out = helpers.run_with_dev_shm(script, size, tmp)
    assert out.returncode == 0, out.stdout + out.stderr
    assert 'OK' in out.stdout, out.stdout + out.stderr
    # Only the first batch, which sizes the slots, came by copy.
    assert 'BY_COPY 1' in out.stdout, out.stdout
    if size == '0':
        assert not helpers.warning_lines(out.stdout), out.stdout
    else:
        assert 'so they were placed in {}'.format(tmp) in out.stdout, \
            out.stdout
    assert 'could not reserve' not in out.stdout, out.stdout


def test_a_slot_reserved_while_the_room_is_measured_counts_once(
        method, tmp_path):
    # A worker reserves a slot while the main process measures the room
    # for the next: here always, just before the main process looks at
    # that slot (as it did in 1 run of 36 of the test above, by chance).
    # The reserved room must not be counted as free: a slot placed in a
    # /dev/shm without room for it came by copy, with a warning.
    script = tmp_path / 'small.py'
    script.write_text(SMALL_DEV_SHM_SCRIPT.format(
        tests=TESTS_DIR, method=method, n_batches=12,
        reserve_when_measured=True))
    tmp = tmp_path / 'tmp'
    tmp.mkdir()
    out = helpers.run_with_dev_shm(script, '4M', tmp)
    assert out.returncode == 0, out.stdout + out.stderr
    assert 'OK' in out.stdout, out.stdout + out.stderr
    assert 'could not reserve' not in out.stdout, out.stdout
    assert 'BY_COPY 1' in out.stdout, out.stdout
    assert 'so they were placed in {}'.format(tmp) in out.stdout, \
        out.stdout


@pytest.mark.parametrize('error', ['ENOSPC', 'ENOMEM'])
def test_workers_that_cannot_reserve_a_slot_send_its_batches(method, error):
    # Every worker fails to reserve its slots (a full /dev/shm; a tmpfs
    # under memory pressure): the batches come by copy, right, with one
    # warning, and no worker dies.
    dataset = helpers.Big(48, sizes=[8192])
    init = functools.partial(helpers.no_room_init, getattr(errno, error),
                             None)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        with chainiter.MultiprocessIterator(
                dataset, 4, n_processes=2, n_prefetch=4, seed=3,
                start_method=method, worker_init_fn=init) as it:
            ref = chainiter.SerialIterator(dataset, 4, seed=3)
            for _ in range(24):
                assert helpers.fingerprint(next(it)) == \
                    helpers.fingerprint(next(ref))
            assert it.stats['by_copy'] == 24
    messages = [str(w.message) for w in record]
    assert [m for m in messages if 'could not reserve' in m and
            os.strerror(getattr(errno, error)) in m], messages
    assert not any(issubclass(w.category, chainiter.WorkerRestartWarning)
                   for w in record), messages


def test_a_slot_that_cannot_be_reserved_after_a_fork(method, tmp_path):
    # A fork retires the slot of the batch the user holds (the child may
    # read it); its index gets new memory, which the worker then cannot
    # reserve: the worker must not write into the retired slot, and the
    # batches must be right.
    if not hasattr(os, 'fork'):
        pytest.skip('no os.fork here')
    flag = str(tmp_path / 'full')
    dataset = helpers.Big(4000, sizes=[4096])
    init = functools.partial(helpers.no_room_init, errno.ENOSPC, flag)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', chainiter.SharedMemoryWarning)
        with chainiter.MultiprocessIterator(
                dataset, 4, n_processes=1, n_prefetch=2, shuffle=False,
                start_method=method, worker_init_fn=init) as it:
            ref = chainiter.SerialIterator(dataset, 4, shuffle=False)
            for _ in range(10):
                next(it), next(ref)
            held = next(it)
            kept = helpers.fingerprint(held)
            assert kept == helpers.fingerprint(next(ref))
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:                # the child holds the slot: waits
                os.close(w)
                os.read(r, 1)
                os._exit(0)
            os.close(r)
            try:
                open(flag, 'w').close()
                for _ in range(40):
                    assert helpers.fingerprint(next(it)) == \
                        helpers.fingerprint(next(ref))
                assert helpers.fingerprint(held) == kept
            finally:
                os.close(w)
                os.waitpid(pid, 0)


@pytest.mark.parametrize('tmp_room', ['enough', 'none'])
def test_dev_shm_filled_while_running(method, tmp_path, tmp_room):
    script = tmp_path / 'fill.py'
    script.write_text(FILL_SCRIPT.format(tests=TESTS_DIR, method=method))
    tmp = tmp_path / 'tmp'
    tmp.mkdir()
    out = helpers.run_with_dev_shm(
        script, '1M', tmp, None if tmp_room == 'enough' else '64k')
    assert out.returncode == 0, out.stdout + out.stderr
    assert 'OK' in out.stdout
    assert 'WARNING SharedMemoryWarning' in out.stdout, out.stdout
    assert 'Bus error' not in out.stderr


FDS_SCRIPT = '''
import os, resource, sys, warnings
sys.path.insert(0, {tests!r})
import chainiter, helpers


def main():
    # Deep prefetch of 1 MiB examples under a low limit of descriptors:
    # each slot costs two in the main process, so the slots run out first.
    dataset = helpers.Megabyte()
    open_now = len(os.listdir('/proc/self/fd'))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 48, hard))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        with chainiter.MultiprocessIterator(
                dataset, 2, n_processes=2, n_prefetch=60, shuffle=False,
                start_method={method!r}) as it, \\
                chainiter.SerialIterator(dataset, 2, shuffle=False) as ref:
            for _ in range(80):
                assert helpers.fingerprint(next(it)) == \\
                    helpers.fingerprint(next(ref))
    print('OK')
    for w in record:
        print('WARNING', w.category.__name__, w.message)


if __name__ == '__main__':
    main()
'''


def test_descriptors_run_out_under_deep_prefetch(method, tmp_path):
    child = run_script(tmp_path, FDS_SCRIPT, method=method)
    warned = [line for line in child.stdout.splitlines()
              if line.startswith('WARNING SharedMemoryWarning')]
    assert any('n_prefetch=60' in line for line in warned), child.stdout


TUNED_FDS_SCRIPT = '''
import os, resource, sys, warnings
sys.path.insert(0, {tests!r})
import numpy
import chainiter, helpers


def main():
    # The self-tuning depth would take 34 slots for these small batches
    # (68 descriptors here); it stays within the descriptors there are.
    dataset = chainiter.datasets.TupleDataset(
        numpy.arange(4096, dtype=numpy.float32), numpy.arange(4096))
    open_now = len(os.listdir('/proc/self/fd'))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 64, hard))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        with chainiter.MultiprocessIterator(
                dataset, 16, n_processes=2, seed=1, start_method={method!r},
                converter=chainiter.concat_examples) as it, \\
                chainiter.SerialIterator(dataset, 16, seed=1) as ref:
            for _ in range(300):
                assert helpers.fingerprint(next(it)) == \\
                    helpers.fingerprint(chainiter.concat_examples(next(ref)))
            print('STATS', it.stats['by_copy'], it.stats['prefetch'],
                  it.stats['batches_per_task'])
    print('OK')
    for w in record:
        print('WARNING', w.category.__name__, w.message)


if __name__ == '__main__':
    main()
'''


def test_the_self_tuning_depth_stays_within_the_descriptors(method,
                                                           tmp_path):
    child = run_script(tmp_path, TUNED_FDS_SCRIPT, method=method)
    assert not helpers.warning_lines(child.stdout), child.stdout
    stats, = [line.split()[1:] for line in child.stdout.splitlines()
              if line.startswith('STATS')]
    by_copy, depth, group = map(int, stats)
    assert by_copy == 1           # the first batch, which sizes the slots
    # Slots in flight (a slot holds a group of batches, as many as load in
    # GROUP_S: their number depends on the machine's speed).
    assert depth % group == 0
    assert 1 <= depth // group < 32


ONE_GROUP_SCRIPT = '''
import os, resource, sys, warnings
sys.path.insert(0, {tests!r})
import numpy
import chainiter


class Grouped(chainiter.MultiprocessIterator):
    # Groups of 4 batches from the third batch on, whatever the speed.
    GROUP_AFTER = 2
    GROUP_S = 10.0
    MAX_GROUP = 4


def main():
    # Descriptors for one group in flight: each is needed by the next()
    # right after the one that sent it (the receiver thread may be
    # sending it then), and each must take a free slot.
    dataset = numpy.arange(3 * 4000, dtype=numpy.float32).reshape(4000, 3)
    open_now = len(os.listdir('/proc/self/fd'))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 56, hard))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        with Grouped(dataset, 5, n_processes=2, shuffle=False,
                     start_method={method!r},
                     converter=chainiter.concat_examples) as it:
            for i in range(2000):
                j = i * 5 % 4000
                assert (next(it) == dataset[j:j + 5]).all()
            print('STATS', it.stats['by_copy'], it.stats['prefetch'],
                  it.stats['batches_per_task'])
    print('OK')
    for w in record:
        print('WARNING', w.category.__name__, w.message)


if __name__ == '__main__':
    main()
'''


def test_one_group_in_flight_is_loaded_once_into_its_slot(method, tmp_path):
    # Each group once: a group loaded twice left its second slot owned by
    # a batch no one takes, and the batches came by copy.
    child = run_script(tmp_path, ONE_GROUP_SCRIPT, method=method)
    assert not helpers.warning_lines(child.stdout), child.stdout
    stats, = [line.split()[1:] for line in child.stdout.splitlines()
              if line.startswith('STATS')]
    assert list(map(int, stats)) == [1, 4, 4]


FIRST_BATCH_FDS_SCRIPT = '''
import os, resource, sys, warnings
sys.path.insert(0, {tests!r})
import numpy
import chainiter, helpers


def use_up_descriptors():
    """Open files up to ``ulimit -n``, less one: the first batch's buffers
    take more than that (a file and its mapping)."""
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    os.close(held.pop())
    return held


def main():
    dataset = chainiter.datasets.TupleDataset(
        numpy.arange(3 * 4096, dtype=numpy.float32).reshape(4096, 3),
        numpy.arange(4096))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        with chainiter.MultiprocessIterator(
                dataset, 8, n_processes=2, seed=1, start_method={method!r},
                converter={converter}) as it, \\
                chainiter.SerialIterator(dataset, 8, seed=1) as ref:
            convert = {converter} or (lambda batch: batch)
            # The workers have started; the limit is near, as in a program
            # that holds many files when it asks for the first batch.
            resource.setrlimit(resource.RLIMIT_NOFILE,
                               (len(os.listdir('/proc/self/fd')) + 64, hard))
            held = use_up_descriptors()
            try:
                for _ in range(3):
                    assert helpers.fingerprint(next(it)) == \\
                        helpers.fingerprint(convert(next(ref)))
                print('POSITION', it.current_position)
            finally:
                for fd in held:
                    os.close(fd)
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            for _ in range(200):
                assert helpers.fingerprint(next(it)) == \\
                    helpers.fingerprint(convert(next(ref)))
            copied = it.stats['by_copy']
            for _ in range(100):
                assert helpers.fingerprint(next(it)) == \\
                    helpers.fingerprint(convert(next(ref)))
            print('STATS', copied, it.stats['by_copy'])
    print('OK')
    for w in record:
        print('WARNING', w.category.__name__, w.message)


if __name__ == '__main__':
    main()
'''


@pytest.mark.parametrize('converter', ['None', 'chainiter.concat_examples'])
def test_descriptors_used_up_at_the_first_batch(method, converter, tmp_path):
    # The first batch, which sizes the buffers, comes by copy as later
    # ones do when no slot can be made (it raised EMFILE from every
    # next()), with one warning that names the limit; once descriptors are
    # free again the buffers are made and the workers write the batches.
    child = run_script(tmp_path, FIRST_BATCH_FDS_SCRIPT, method=method,
                       converter=converter)
    assert 'POSITION 24' in child.stdout, child.stdout
    warned = helpers.warning_lines(child.stdout)
    assert len(warned) == 1, child.stdout
    assert 'SharedMemoryWarning' in warned[0] and \
        'ulimit -n' in warned[0], child.stdout
    stats, = [line.split()[1:] for line in child.stdout.splitlines()
              if line.startswith('STATS')]
    copied, later = map(int, stats)
    assert copied == later, child.stdout


AS_SCRIPT = '''
import resource, sys, warnings
sys.path.insert(0, {tests!r})
import chainiter, helpers


def vm_size():
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmSize:'):
                return int(line.split()[1]) * 1024


def main():
    # Address space for the batches that come by copy, not for the 62
    # slots of 2 MiB that n_prefetch=60 may use: mapping one fails with
    # ENOMEM, and the batches come by copy.
    dataset = helpers.Megabyte()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        with chainiter.MultiprocessIterator(
                dataset, 2, n_processes=2, n_prefetch=60, shuffle=False,
                start_method={method!r}) as it, \\
                chainiter.SerialIterator(dataset, 2, shuffle=False) as ref:
            # The workers have started: the limit is the main process's.
            limit = vm_size() + 96 * 2 ** 20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            for _ in range(80):
                assert all((a == b).all() for a, b in zip(next(it),
                                                          next(ref)))
    print('OK')
    for w in record:
        print('WARNING', w.category.__name__, w.message)


if __name__ == '__main__':
    main()
'''


def test_address_space_runs_out_under_deep_prefetch(method, tmp_path):
    child = run_script(tmp_path, AS_SCRIPT, method=method)
    warned = [line for line in child.stdout.splitlines()
              if line.startswith('WARNING SharedMemoryWarning')]
    assert any('n_prefetch=60' in line and 'address space' in line
               for line in warned), child.stdout


def test_a_warning_raised_as_an_error_loses_no_batch(method):
    # The suite turns warnings into errors, as users' -W error does: the
    # SharedMemoryWarning of an oversize example is raised from next(),
    # and the next call returns that batch.
    dataset = helpers.Big(16, sizes=[10] * 4 + [5000] * 12)
    with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              start_method=method) as it, \
            SerialIterator(dataset, 4, shuffle=False) as ref:
        got = [fingerprint(next(it))]
        with pytest.raises(chainiter.SharedMemoryWarning):
            next(it)
        got += [fingerprint(next(it)) for _ in range(7)]
        expected = [fingerprint(next(ref)) for _ in range(8)]
    assert got == expected


def test_deaths_are_reported_while_another_thread_reaps(method, tmp_path):
    """multiprocessing.active_children(), called by the user (or a library)
    in another thread, may reap a dead worker first: every death is still
    reported, once, and no batch is lost.  Under fork and spawn the warning
    names the signal.  Under forkserver a death's status is one message on
    a pipe, and when two threads poll the process at once CPython records
    255 for the one that finds the pipe empty, so only the death is
    promised there."""
    stop = threading.Event()

    def poll_children():
        while not stop.is_set():
            multiprocessing.active_children()

    dataset = helpers.KillsOnceEach(40, range(2, 40, 5), str(tmp_path))
    poller = threading.Thread(target=poll_children, daemon=True)
    poller.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            with MultiprocessIterator(dataset, 2, n_processes=2,
                                      n_prefetch=2, shuffle=False,
                                      start_method=method) as it:
                got = [int(x[0]) for _ in range(20) for x in next(it)]
    finally:
        stop.set()
        poller.join(10)
    assert got == list(range(40))
    deaths = [str(w.message) for w in caught
              if issubclass(w.category, chainiter.WorkerRestartWarning)]
    assert len(deaths) == 8, deaths
    assert all(' died with ' in message for message in deaths), deaths
    if method != 'forkserver':
        assert all('signal 9' in message for message in deaths), deaths


def test_buffers_made_and_dropped_in_many_threads_at_once():
    # Buffers made without reserving are counted in the room for the next
    # (shm_files), while other threads make and drop theirs: an iterator's
    # slots in one thread, another iterator's in another, a garbage
    # collection that frees one anywhere.  Counting must not see the
    # registry change under it ("Set changed size during iteration", on
    # the free-threaded build).
    from chainiter.iterators.pipeline.memory.shm import SharedBuffer
    errors = []
    start = threading.Barrier(4)

    def make_and_drop():
        try:
            start.wait(timeout=30)
            live = []
            for _ in range(300):
                live.append(SharedBuffer.allocate(4096, reserve=False))
                if len(live) > 32:
                    live.pop(0).release()
            for shared in live:
                shared.release()
        except BaseException as e:     # reported below, with its type
            errors.append(e)

    threads = [threading.Thread(target=make_and_drop) for _ in range(4)]
    # With the GIL, threads switch often enough to meet there too.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
