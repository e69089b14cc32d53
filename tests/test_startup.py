"""A worker that cannot start raises at once, with the real exception as
``__cause__``, and no more workers are started."""

import threading
import time

import pytest

import chainiter
from chainiter import MultiprocessIterator

import helpers


def _workers_gone(timeout):
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
