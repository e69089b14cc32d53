"""A worker that cannot start raises at once, with the real exception as
``__cause__``, and no more workers are started."""

import gc
import threading
import time

import pytest

import chainiter
from chainiter import MultiprocessIterator

import helpers


def _workers_gone(timeout):
    # Iterators of earlier tests that wait for the collector would count
    # (helpers.worker_pids sees every iterator's workers): collect them.
    gc.collect()
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        alive = helpers.worker_pids()
        if not alive or time.monotonic() >= deadline:
            return not alive
        pause.wait(0.02)


def _raises_startup_failure(it, cause_type, text):
    for _ in range(3):      # every later next() too, never a hang
        with pytest.raises(chainiter.ChainiterError,
                           match='could not start') as info:
            next(it)
        assert not isinstance(info.value, chainiter.WorkerDiedError)
        assert isinstance(info.value.__cause__, cause_type)
        assert text in str(info.value.__cause__)
        assert 'Traceback' in str(info.value.__cause__.__cause__)


def test_failing_worker_init_fn(method):
    with MultiprocessIterator(list(range(8)), 2, n_processes=2,
                              worker_init_fn=helpers.failing_init,
                              start_method=method) as it:
        _raises_startup_failure(it, OSError, 'no GPU for worker')
        # The failed workers exit and none is started again.
        assert _workers_gone(10)
        _raises_startup_failure(it, OSError, 'no GPU for worker')
        assert _workers_gone(0)


@pytest.mark.parametrize('method', ['forkserver', 'spawn'])
def test_dataset_that_cannot_be_unpickled_in_the_worker(method):
    with MultiprocessIterator(helpers.UnpicklesBadly(), 2, n_processes=2,
                              start_method=method) as it:
        _raises_startup_failure(it, ValueError, 'refuses to be unpickled')


@pytest.mark.parametrize('method', ['forkserver', 'spawn'])
def test_a_replacement_worker_that_cannot_get_the_dataset(
        method, tmp_path, monkeypatch, capfd):
    # The first worker starts; the one that replaces it (after its one
    # task) cannot unpickle the dataset.  next() says so, and no thread
    # prints "Exception in thread".
    failed_threads = []
    monkeypatch.setattr(threading, 'excepthook', failed_threads.append)
    dataset = helpers.UnpicklesOnce(tmp_path / 'loads', 1)
    with MultiprocessIterator(dataset, 2, n_processes=1,
                              maxtasksperchild=1, shuffle=False,
                              start_method=method) as it:
        batches = []
        with pytest.raises(chainiter.ChainiterError,
                           match='could not start') as info:
            for _ in range(4):
                batches.append(next(it))
        # The batch the first worker loads may fail with the rest: the
        # replacement starts as that worker takes its last task.
        assert batches in ([], [[0, 1]])
        assert 'refuses to be unpickled again' in str(info.value.__cause__)
    assert not failed_threads, failed_threads
    assert 'Exception in thread' not in capfd.readouterr().err


@pytest.mark.parametrize('method', ['forkserver', 'spawn'])
def test_replacement_workers_get_the_first_workers_pickle(method):
    # The dataset is pickled once, when the first worker starts: the
    # workers that replace it (after each task) get those bytes, so a
    # dataset that can no longer be pickled still reaches them.
    dataset = helpers.PicklesUntilRefused()
    with MultiprocessIterator(dataset, 2, n_processes=1,
                              maxtasksperchild=1, shuffle=False,
                              start_method=method) as it:
        dataset.refuse = True      # the first worker has it already
        batches = [next(it) for _ in range(8)]
    assert batches == [[0, 1], [2, 3], [4, 5], [6, 7]] * 2


def test_a_startup_error_that_cannot_be_unpickled_here(
        method, monkeypatch, capfd):
    # The worker's error pickles there, but not back in the main process:
    # next() says what is known, and no thread prints.
    failed_threads = []
    monkeypatch.setattr(threading, 'excepthook', failed_threads.append)
    with MultiprocessIterator(list(range(8)), 2, n_processes=1,
                              worker_init_fn=helpers.homesick_init,
                              start_method=method) as it:
        with pytest.raises(chainiter.ChainiterError,
                           match='could not start') as info:
            next(it)
        text = str(info.value)
        assert 'HomesickError' in text and 'no GPU for worker 0' in text
        assert 'cannot be rebuilt' in text
    assert not failed_threads, failed_threads
    assert 'Exception in thread' not in capfd.readouterr().err


_UNGUARDED = '''
import sys
import numpy
import chainiter


class Numbers:
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return numpy.float32(i)


# No "if __name__ == '__main__':" guard.
it = chainiter.MultiprocessIterator(Numbers(), 4, n_processes=3,
                                    shuffle=False, start_method=sys.argv[1])
print(*[float(x) for x in next(it)])
it.finalize()
'''


@pytest.mark.timeout(120)
def test_a_script_without_the_main_guard_is_told_so(method, tmp_path):
    import os
    import subprocess
    import sys
    path = tmp_path / 'unguarded.py'
    path.write_text(_UNGUARDED)
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))] +
        [p for p in [env.get('PYTHONPATH')] if p])
    done = subprocess.run([sys.executable, str(path), method],
                          cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=100)
    if method == 'fork':       # nothing imports the script again
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ['0.0', '1.0', '2.0', '3.0']
        return
    assert done.returncode == 1, done.stderr
    # Other workers' tracebacks may come after it, or even inside its
    # line (their stderr is the same file): looked for anywhere.
    told = [line for line in done.stderr.splitlines() if
            'ChainiterError' in line and 'worker process' in line]
    assert len(told) == 1, done.stderr
    last, = told
    assert 'before it started' in last
    assert 'if __name__ == \'__main__\':' in last
    # Told at the first death: no restarts, no WorkerDiedError.
    assert 'WorkerRestartWarning' not in done.stderr
    assert 'WorkerDiedError' not in done.stderr
    # One worker's traceback, which names the script's line and the fix,
    # and the main process's: not one of multiprocessing's 40-line
    # tracebacks from every worker.
    assert done.stderr.count('Traceback (most recent call last)') <= 2, \
        done.stderr
    assert 'bootstrapping phase' not in done.stderr
    assert len(done.stderr.splitlines()) <= 60, done.stderr
