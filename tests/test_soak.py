"""Soak: a million examples while workers are killed at random moments.

Run with:  python -m pytest -m slow tests/test_soak.py -s
"""

import os
import signal
import time
import warnings

import numpy
import pytest

import chainiter

from helpers import IndexAndPid, shm_files, wait_processes_gone

N_EXAMPLES = 200_000
EPOCHS = 5
BATCH = 1000


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_million_examples_with_random_worker_kills(method):
    before = shm_files()
    dataset = IndexAndPid(N_EXAMPLES)
    rng = numpy.random.default_rng(0)
    steps = EPOCHS * N_EXAMPLES // BATCH
    kill_at = set(rng.choice(steps, size=40, replace=False).tolist())
    with chainiter.SerialIterator(dataset, BATCH, seed=11) as ref:
        expected = [[i for i, _ in next(ref)] for _ in range(steps)]
    killed = set()
    pids = set()
    kills_due = 0
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        with chainiter.MultiprocessIterator(
                dataset, BATCH, n_processes=2, n_prefetch=2, seed=11,
                start_method=method) as it:
            for step in range(steps):
                batch = next(it)
                assert [i for i, _ in batch] == expected[step], step
                batch_pids = {pid for _, pid in batch}
                pids |= batch_pids
                kills_due += step in kill_at
                # A batch loaded before its worker was killed names only
                # dead pids: the kill then waits for a batch of a live one.
                alive = sorted(batch_pids - killed)
                if kills_due and alive:
                    kills_due -= 1
                    victim = int(rng.choice(alive))
                    try:
                        os.kill(victim, signal.SIGKILL)
                        killed.add(victim)
                    except ProcessLookupError:
                        pass
    elapsed = time.monotonic() - start
    restarts = [w for w in record
                if w.category is chainiter.WorkerRestartWarning]
    others = [w for w in record
              if w.category is not chainiter.WorkerRestartWarning]
    assert not others, [str(w.message) for w in others]
    for epoch in range(EPOCHS):
        seen = numpy.concatenate(expected[epoch * N_EXAMPLES // BATCH:
                                          (epoch + 1) * N_EXAMPLES // BATCH])
        assert numpy.array_equal(numpy.sort(seen), numpy.arange(N_EXAMPLES))
    assert wait_processes_gone(pids, timeout=10)
    assert shm_files() <= before
    print('\n{}: {:,} examples in {:.1f} s ({:,.0f}/s), {} workers killed, '
          '{} restart warnings, {} worker pids seen'.format(
              method, steps * BATCH, elapsed, steps * BATCH / elapsed,
              len(killed), len(restarts), len(pids)))
    assert len(killed) >= 30 and len(restarts) >= len(killed) - 2
