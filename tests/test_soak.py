"""Soak: a million examples while workers are killed at random moments;
and batches compared under interrupts, kills and too few descriptors.

Run with:  python -m pytest -m slow tests/test_soak.py -s
"""

import os
import signal
import subprocess
import sys
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


INTERRUPT_SOAK = '''
import os, random, resource, signal, sys, threading, warnings
sys.path.insert(0, {tests!r})
import chainiter, helpers

BATCHES = {batches}


def inside_next(frame, iterator):
    while frame is not None:
        if frame.f_code.co_name == '__next__' and \\
                frame.f_locals.get('self') is iterator:
            return True
        frame = frame.f_back
    return False


def main():
    # Descriptors for about 20 of the 42 slots that n_prefetch=40 may use.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE,
                       (len(os.listdir('/proc/self/fd')) + 60, hard))
    dataset = helpers.AugmentedDataset(5000, width=300)
    rng = random.Random(0)
    counts = dict(interrupts=0, kills=0)
    target = []

    def handler(signum, frame):
        if target and inside_next(frame, target[0]):
            counts['interrupts'] += 1
            raise KeyboardInterrupt

    stop = threading.Event()
    main_thread = threading.main_thread().ident

    def fire():
        while not stop.wait(rng.uniform(0, 0.003)):
            signal.pthread_kill(main_thread, signal.SIGINT)

    signal.signal(signal.SIGINT, handler)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        with chainiter.MultiprocessIterator(
                dataset, 16, n_processes=2, n_prefetch=40, seed=5,
                start_method={method!r}) as it, \\
                chainiter.SerialIterator(dataset, 16, seed=5) as ref:
            target.append(it)
            threading.Thread(target=fire, daemon=True).start()
            done = 0
            while done < BATCHES:
                try:
                    got = helpers.fingerprint(next(it))
                except KeyboardInterrupt:
                    continue
                assert got == helpers.fingerprint(next(ref)), done
                done += 1
                if done % 500 == 0:
                    pids = sorted(helpers.worker_pids())
                    if pids:
                        os.kill(rng.choice(pids), signal.SIGKILL)
                        counts['kills'] += 1
            stop.set()
    kinds = sorted({{w.category.__name__ for w in record}})
    print('OK', done, counts['interrupts'], counts['kills'], kinds)


if __name__ == '__main__':
    main()
'''


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_soak_with_interrupts_kills_and_few_descriptors(method, tmp_path):
    # Every batch compared with SerialIterator's while KeyboardInterrupts
    # land anywhere in next(), workers are killed, and descriptors run out
    # for the deep prefetch; in a child, where the limit is set.
    script = tmp_path / 'soak.py'
    script.write_text(INTERRUPT_SOAK.format(
        tests=os.path.dirname(os.path.abspath(__file__)), method=method,
        batches=int(os.environ.get('CHAINITER_SOAK_BATCHES', 20000))))
    child = subprocess.run([sys.executable, str(script)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           universal_newlines=True, timeout=850)
    assert child.returncode == 0, child.stderr[-3000:]
    print(child.stdout)
    ok, done, interrupts, kills = child.stdout.split()[:4]
    assert ok == 'OK' and int(done) == int(os.environ.get(
        'CHAINITER_SOAK_BATCHES', 20000))
    assert int(interrupts) > 100 and int(kills) >= int(done) // 1000
    assert 'SharedMemoryWarning' in child.stdout    # descriptors ran out
