"""The statistics (``it.stats``) and the verdict (``chainiter.diagnose``)
of the in-process iterators; the multiprocess ones are in
test_multiprocess.py."""

import copy
import pickle
import time

import pytest

import chainiter
from chainiter import MultithreadIterator, SerialIterator
from chainiter.iterators import _stats

from helpers import Slow, compute

STAT_KEYS = {'batches', 'examples', 'first_batch_s', 'wait_s',
             'wait_mean_s', 'elapsed_s', 'wait_fraction', 'examples_per_s',
             'timed_batches', 'ready'}
# The pipeline's own (MultithreadIterator's, as MultiprocessIterator's).
PIPELINE_KEYS = {'by_copy', 'prefetch', 'batches_per_task',
                 'workers_active', 'worker_busy', 'worker_cpu_wait',
                 'loads_in'}


def test_stats_count_batches_and_examples_exactly(make):
    with make(list(range(10)), 4, repeat=False) as it:
        assert it.stats['batches'] == 0
        assert it.stats['first_batch_s'] is None
        for _ in it:
            pass
        stats = it.stats
    assert set(stats) == STAT_KEYS | (
        PIPELINE_KEYS if isinstance(it, MultithreadIterator) else set())
    assert (stats['batches'], stats['examples']) == (3, 10)
    assert stats['timed_batches'] == 2
    assert stats['first_batch_s'] >= 0 and stats['wait_s'] >= 0
    assert 0 <= stats['wait_fraction']
    with make(list(range(10)), 4) as it:      # wrapping batches count 4
        for _ in range(5):
            next(it)
        assert (it.stats['batches'], it.stats['examples']) == (5, 20)
        it.reset_stats()
        assert (it.stats['batches'], it.stats['examples']) == (0, 0)
        next(it)
        assert it.stats['timed_batches'] == 1   # the window began at reset
        copied = copy.copy(it)
        assert copied.stats['batches'] == 0      # its own counters
        next(copied)
        assert it.stats['batches'] == 1
        assert pickle.loads(pickle.dumps(it)).stats['batches'] == 0


def test_multithread_stats_count_ready_batches():
    with MultithreadIterator(list(range(100)), 4, n_threads=2,
                             n_prefetch=3) as it:
        next(it)
        # The next batches load in the background: wait for them (the
        # depth is at least 3: they are all ready within the deadline).
        # Nothing signals a ready batch to the user: this polls the
        # count until it holds or the deadline passes (the assertion
        # below, not the poll, decides).
        deadline = time.monotonic() + 10
        while it.stats['ready'] < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert it.stats['ready'] >= 3
        ready = it.stats['ready']
        next(it)
        assert it.stats['ready'] >= ready - 1


def test_slow_dataset_fast_consumer_is_input_bound(make):
    with make(Slow(40, 0.004), 2) as it:
        for _ in range(8):
            next(it)
        verdict = chainiter.diagnose(it)
        stats = it.stats
    assert verdict.startswith('input-bound: next() waited'), verdict
    assert stats['wait_fraction'] > 0.5
    assert 'try' in verdict


def test_fast_dataset_slow_consumer_is_compute_bound():
    # Threads load the next batch while the consumer computes.
    with MultithreadIterator(list(range(100)), 4, n_threads=2) as it:
        next(it)
        for _ in range(10):
            compute(0.03)
            next(it)
        verdict = chainiter.diagnose(it)
    assert verdict.startswith('compute-bound: next() waited'), verdict
    assert 'the loader is not the bottleneck' in verdict


def test_diagnose_needs_a_few_batches():
    with SerialIterator(list(range(10)), 2) as it:
        assert chainiter.diagnose(it).startswith('not enough batches')
        next(it)
        next(it)
        assert chainiter.diagnose(it).startswith('not enough batches')


class _Stub:
    def __init__(self, stats, **attributes):
        self.stats = dict(dict.fromkeys(STAT_KEYS, 0), **stats)
        self.__dict__.update(attributes)


@pytest.mark.parametrize('attributes, stats, expected', [
    ({}, {'wait_fraction': 0.75}, 'try MultiprocessIterator(n_processes='),
    ({'n_threads': 1}, {'wait_fraction': 0.5}, 'try n_threads=2'),
    ({'n_processes': 1}, {'wait_fraction': 0.5, 'worker_busy': 0.95},
     'try n_processes=2'),
    ({'n_processes': 4}, {'wait_fraction': 0.5, 'worker_busy': 0.3,
                          'workers_active': 4, 'prefetch': 2},
     'try n_prefetch=4'),
    ({'n_processes': 10 ** 6}, {'wait_fraction': 0.5, 'worker_busy': 1.0},
     'use every CPU'),
    ({}, {'wait_fraction': 0.05}, 'compute-bound: next() waited 5%'),
])
def test_diagnose_advice(attributes, stats, expected, monkeypatch):
    monkeypatch.setattr(_stats, 'usable_cpus', lambda: 8)
    stats = dict(stats, timed_batches=10, elapsed_s=1.0, batches=11,
                 wait_mean_s=0.01, examples_per_s=100.0)
    verdict = chainiter.diagnose(_Stub(stats, **attributes))
    assert expected in verdict, verdict


def _judge(cpus=2, n_processes=1, converter_in_main=False, **stats):
    """The verdict of an input-bound loop of workers, from its figures."""
    stats = dict({'wait_fraction': 0.9, 'wait_mean_s': 0.003,
                  'examples_per_s': 1000.0, 'elapsed_s': 1.0,
                  'timed_batches': 300, 'batches': 301, 'by_copy': 1,
                  'prefetch': 16, 'batches_per_task': 1,
                  'workers_active': n_processes, 'worker_busy': 0.9,
                  'worker_cpu_wait': 0.0}, **stats)
    return _stats.judge(stats, cpus, n_processes=n_processes,
                        converter_in_main=converter_in_main)


def test_one_busy_worker_is_told_to_add_workers_not_prefetch():
    # One worker of CPU-bound examples: between its chunks it reads tasks
    # and writes results, which is not timed as loading, and its busy
    # share read 0.47 to 0.73 (on 2 CPUs; lower with more load).  Tasks
    # wait for it all the while: more workers, not more prefetch.
    for busy in (0.3, 0.47, 0.73, 0.9, 1.0):
        verdict = _judge(worker_busy=busy)
        assert 'try n_processes=2' in verdict, verdict
        assert 'n_prefetch' not in verdict
    # Groups of batches: 64 batches in flight are 4 tasks, 2 a worker.
    verdict = _judge(n_processes=2, cpus=4, worker_busy=0.5, prefetch=64,
                     batches_per_task=16)
    assert 'try n_processes=' in verdict, verdict


def test_too_few_tasks_in_flight_for_the_workers_is_too_shallow():
    verdict = _judge(n_processes=4, cpus=8, worker_busy=0.4, prefetch=4)
    assert 'too shallow' in verdict and 'try n_prefetch=8' in verdict, \
        verdict
    # Counted over the active workers: 4 tasks keep 2 of them going.
    verdict = _judge(n_processes=4, cpus=8, worker_busy=0.4, prefetch=4,
                     workers_active=2)
    assert 'n_prefetch' not in verdict, verdict


def test_idle_workers_behind_the_main_process_are_told_so():
    verdict = _judge(worker_busy=0.4, by_copy=200)
    assert 'copying batches (200 of 301 by copy)' in verdict, verdict
    verdict = _judge(worker_busy=0.4, converter_in_main=True)
    assert 'converter_in_workers=True' in verdict, verdict
    # Busy workers are the limit, whatever else.
    assert 'try n_processes=2' in _judge(worker_busy=0.9, by_copy=200)


def test_workers_waiting_for_cpus_others_hold_is_too_noisy():
    # The same loop on a loaded machine: whatever the busy share, the
    # verdict would follow the load.
    for busy in (0.3, 0.6, 0.95):
        verdict = _judge(worker_busy=busy, worker_cpu_wait=0.6)
        assert verdict.startswith('input-bound: next() waited 90%')
        assert 'too noisy' in verdict and '60%' in verdict, verdict
        assert 'try' not in verdict
    # Some waits are not noise.
    assert 'try n_processes=2' in _judge(worker_cpu_wait=0.2)
    # Waiting for CPUs its own workers hold: every CPU is used.
    verdict = _judge(n_processes=4, cpus=2, worker_cpu_wait=0.6)
    assert 'use every CPU' in verdict, verdict
    # Compute-bound is compute-bound, however noisy.
    assert _judge(wait_fraction=0.02, worker_cpu_wait=0.9).startswith(
        'compute-bound')
