"""Iterators used from several threads: finalize() from another thread
wakes a waiting next(); two next() at once get a clear error, never a hang
or a corrupted position."""

import gc
import threading
import time

import numpy
import pytest

import chainiter
from chainiter import MultiprocessIterator, MultithreadIterator, SerialIterator

import helpers


def call_in_thread(function):
    outcome = []

    def run():
        try:
            outcome.append(function())
        except BaseException as e:   # what the thread raised
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_finalize_wakes_next_waiting_in_threads():
    dataset = helpers.Gate(8, blocked=2)
    it = MultithreadIterator(dataset, 4, shuffle=False, n_threads=2)
    waiting, outcome = call_in_thread(lambda: next(it))
    assert helpers.wait_until_in(waiting, '_collect', 30)
    assert dataset.entered.wait(30)
    # finalize() joins the loading threads, so it returns once the stuck
    # example is released; the waiting next() must not wait for that.
    finalizing, _ = call_in_thread(it.finalize)
    waiting.join(10)
    assert not waiting.is_alive()
    assert isinstance(outcome[0], chainiter.IteratorFinalizedError)
    dataset.release.set()
    finalizing.join(10)
    assert not finalizing.is_alive()


def test_finalize_wakes_next_waiting_for_workers(method):
    # dataset[1] takes ten minutes; the workers are ended by finalize().
    dataset = helpers.Stalling(8, slow=1, seconds=600)
    it = MultiprocessIterator(dataset, 4, shuffle=False, n_processes=1,
                              dataset_timeout=None, start_method=method)
    waiting, outcome = call_in_thread(lambda: next(it))
    assert helpers.wait_until_in(waiting, 'wait', 60)
    it.finalize()
    waiting.join(10)
    assert not waiting.is_alive()
    assert isinstance(outcome[0], chainiter.IteratorFinalizedError)


KINDS = {
    'serial': SerialIterator,
    'thread': lambda *a, **k: MultithreadIterator(*a, n_threads=2, **k),
}


@pytest.mark.parametrize('kind', sorted(KINDS))
def test_second_concurrent_next_is_a_clear_error(kind):
    dataset = helpers.Gate(12, blocked=5)
    with KINDS[kind](dataset, 4, shuffle=False) as it:
        assert next(it) == [0, 1, 2, 3]
        first, outcome = call_in_thread(lambda: next(it))
        assert dataset.entered.wait(30)
        assert helpers.wait_until_in(first, '__next__', 30)
        with pytest.raises(chainiter.ChainiterError, match='two threads'):
            next(it)
        dataset.release.set()
        first.join(30)
        assert outcome == [[4, 5, 6, 7]]
        assert next(it) == [8, 9, 10, 11]      # nothing lost or repeated


def test_finalize_releases_shared_memory_at_once(method):
    gc.collect()    # earlier tests' iterators go now, not during this one
    before = helpers.mapped_buffers()
    iterators = []
    for _ in range(3):
        it = MultiprocessIterator(helpers.Megabyte(), 8, n_processes=2,
                                  n_prefetch=4, shuffle=False,
                                  converter=chainiter.concat_examples,
                                  start_method=method)
        for _ in range(5):
            batch = next(it)
        it.finalize()
        iterators.append(it)     # still referenced
    # Only the slot of the batch still held is mapped (with the descriptor
    # that the mapping keeps).
    assert helpers.mapped_buffers() == (before[0] + 1, before[1] + 1)
    assert (batch[:, 0, 0] == range(32, 40)).all()   # and it is intact
    del batch
    assert helpers.mapped_buffers() == before


@pytest.mark.timeout(120)
def test_finalize_releases_the_slots_of_grouped_batches_at_once(method):
    # At the defaults small batches go to the workers in groups, and the
    # receiver thread reads each group's arrays as it arrives: those
    # waiting to be handed out must not keep their slots mapped either.
    gc.collect()
    before = helpers.mapped_buffers()
    n = 4000
    dataset = chainiter.datasets.TupleDataset(
        numpy.arange(n * 16, dtype=numpy.float32).reshape(n, 16),
        numpy.arange(n))
    it = MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              converter=chainiter.concat_examples,
                              start_method=method)
    taken = 0
    deadline = time.monotonic() + 60
    while it.stats['batches_per_task'] == 1:
        assert time.monotonic() < deadline, it.stats
        batch = next(it)
        taken += 1
    group = it.stats['batches_per_task']
    for _ in range(4 * group):     # past the batches sent one by one
        batch = next(it)
        taken += 1
    while it.stats['ready'] < 2 * group:     # two groups read ahead
        assert time.monotonic() < deadline, it.stats
        threading.Event().wait(0.01)
    it.finalize()
    assert helpers.mapped_buffers() == (before[0] + 1, before[1] + 1)
    first = taken - 1
    assert (batch[1] == range(4 * first, 4 * first + 4)).all()
    del batch
    assert helpers.mapped_buffers() == before


def test_a_resting_receiver_thread_is_woken_by_what_next_needs(
        method, monkeypatch):
    # The receiver thread rests while batches wait for the consumer, and
    # the main thread wakes it when it posts a group or takes the batches
    # down to few.  Otherwise it would look at the sockets only every
    # POLL_S: with ten minutes, a wake-up lost stalls next() past the
    # test's timeout.
    from chainiter.iterators.pipeline.processes import receiver
    monkeypatch.setattr(receiver, 'POLL_S', 600)
    n = 1200
    dataset = chainiter.datasets.TupleDataset(
        numpy.zeros((n, 4), dtype=numpy.float32), numpy.arange(n))
    it = MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              converter=chainiter.concat_examples,
                              start_method=method)
    rests = 0
    with it:
        for epoch in range(3):
            for i in range(n // 4):
                if i % 20 == 0 and (epoch or i):
                    # The pipeline fills: the thread rests.
                    deadline = time.monotonic() + 60
                    while not it._pool.receiver.sleeping:
                        assert time.monotonic() < deadline, it.stats
                        threading.Event().wait(0.001)
                    rests += 1
                batch = next(it)
                assert (batch[1] == range(4 * i, 4 * i + 4)).all()
                assert it.epoch == epoch + (i == n // 4 - 1)
        assert it.stats['batches_per_task'] > 1     # groups were posted
    assert rests == 44


def test_iterator_made_in_a_thread_that_ends(method):
    made = []
    maker = threading.Thread(target=lambda: made.append(MultiprocessIterator(
        helpers.Pids(), 4, n_processes=2, shuffle=False,
        start_method=method)))
    maker.start()
    maker.join(60)
    # Its workers outlive the thread that made it: the same two load
    # every batch, and nothing is lost (a death would also raise
    # WorkerRestartWarning, an error here).
    with made[0] as it:
        batches = [next(it) for _ in range(9)]
    assert [i for b in batches for i, _, _, _ in b] == list(range(12)) * 3
    assert len({pid for b in batches for _, pid, _, _ in b}) == 2
