"""Where ``MultithreadIterator`` loads, on a build with the GIL: in its
threads, or in the main thread inside ``next()`` when that hands out
more examples per second (``flow/loading_mode.py``; chosen by the
iterator, or by ``CHAINITER_THREAD_LOADING``).  Wherever it loads, and
however often it switches, the batches are ``SerialIterator``'s, the
errors and resume are as with the threads, and nothing is left
behind.  (A batch held is never overwritten: test_thread_pipeline.py,
in both places.)"""

import functools
import threading

import numpy
import pytest

import chainiter
from chainiter import (
    MultiprocessIterator, MultithreadIterator, SerialIterator,
    concat_examples)
from chainiter.iterators.pipeline.threads.workers import gil_enabled

import helpers
from helpers import Failing, assert_resume_equivalent, fingerprint

pytestmark = pytest.mark.timeout(60)

needs_gil = pytest.mark.skipif(
    not gil_enabled(), reason='without the GIL the threads always load')


class Switching(MultithreadIterator):
    """Measures the two modes again and again, a batch each: it switches
    every few batches."""
    LOADING_FIRST_PROBE_S = 0.0
    LOADING_WINDOW_S = 0.0
    LOADING_WINDOW_BATCHES = 1


class Ragged:
    """(int32 sequence of length 1..7, float from example_rng(), the id
    of the worker that loaded it)."""

    def __len__(self):
        return 90

    def __getitem__(self, i):
        info = chainiter.get_worker_info()
        return (numpy.arange(1 + i % 7, dtype=numpy.int32) * i,
                float(chainiter.example_rng().random()),
                -1 if info is None else info.id)


def _without_worker(batch):
    """The batch without the worker ids (which differ by kind)."""
    if type(batch) is tuple:
        return batch[:2]
    return [example[:2] for example in batch]


CONVERTERS = [None, functools.partial(concat_examples, padding=0)]


@pytest.fixture
def in_main(monkeypatch):
    monkeypatch.setenv('CHAINITER_THREAD_LOADING', 'main')


@pytest.mark.parametrize('converter', CONVERTERS)
def test_loading_in_the_main_thread_gives_the_serial_batches(
        in_main, converter):
    convert = converter or (lambda batch: batch)
    with MultithreadIterator(Ragged(), 8, n_threads=2, seed=3,
                             converter=converter) as it, \
            SerialIterator(Ragged(), 8, seed=3) as serial:
        for _ in range(40):
            batch = next(it)
            assert it.stats['loads_in'] == 'main thread'
            assert fingerprint(_without_worker(batch)) == fingerprint(
                _without_worker(convert(next(serial))))
            # Loaded as one of the threads would have been.
            ids = batch[2] if type(batch) is tuple else \
                [example[2] for example in batch]
            assert set(numpy.asarray(ids).tolist()) <= {0, 1}
            # Outside dataset[i] the main thread is the main process
            # again.
            assert chainiter.get_worker_info() is None


@pytest.mark.skipif('fork' not in helpers.START_METHODS,
                    reason='no fork here')
def test_a_process_forked_after_loading_in_the_main_thread_is_a_worker(
        in_main):
    with MultithreadIterator(Ragged(), 8, n_threads=2) as it:
        next(it)
    # A worker process forked from this thread knows it is one.
    with MultiprocessIterator(Ragged(), 8, n_processes=2,
                              start_method='fork', shuffle=False) as it:
        assert {example[2] for example in next(it)} <= {0, 1}


@needs_gil
@pytest.mark.parametrize('converter', CONVERTERS)
def test_switching_back_and_forth_loses_and_repeats_no_batch(converter):
    convert = converter or (lambda batch: batch)
    seen = set()
    with Switching(Ragged(), 8, n_threads=2, seed=5,
                   converter=converter) as it, \
            SerialIterator(Ragged(), 8, seed=5) as serial:
        for _ in range(200):
            batch = next(it)
            seen.add(it.stats['loads_in'])
            assert fingerprint(_without_worker(batch)) == fingerprint(
                _without_worker(convert(next(serial))))
    assert seen == {'main thread', 'workers'}


def test_an_error_in_the_main_thread_goes_up_as_from_serial_iterator(in_main):
    with MultithreadIterator(Failing(20, bad=9), 4, n_threads=2,
                             shuffle=False) as it:
        next(it)
        next(it)
        with pytest.raises(KeyError, match='broken example 9') as info:
            next(it)
        notes = getattr(info.value, '__notes__', ['dataset[9]'])
        assert any('dataset[9]' in note for note in notes)
        assert it.current_position == 8      # the batch that failed is next
        with pytest.raises(KeyError):
            next(it)


@needs_gil
@pytest.mark.parametrize('converter', CONVERTERS)
def test_resume_from_and_into_an_iterator_that_switches(converter):
    class Plain(Ragged):
        def __getitem__(self, i):
            return super().__getitem__(i)[:2]

    makes = [functools.partial(kind, Plain(), 6, seed=11, converter=converter)
             for kind in (Switching, MultithreadIterator)]
    if converter is None:
        makes.append(functools.partial(SerialIterator, Plain(), 6, seed=11))
    assert_resume_equivalent(makes[0], makes, 12)


@needs_gil
def test_an_explicit_n_prefetch_or_worker_init_fn_keeps_the_threads():
    for kwargs in (dict(n_prefetch=2), dict(worker_init_fn=lambda i: None)):
        with Switching(Ragged(), 8, n_threads=2, **kwargs) as it:
            for _ in range(40):
                next(it)
                assert it.stats['loads_in'] == 'workers'


def test_finalize_while_tasks_wait_for_the_main_thread(in_main):
    it = MultithreadIterator(Ragged(), 4, n_threads=2)
    next(it)
    it.finalize()
    assert [t for t in threading.enumerate()
            if t.name.startswith('chainiter-worker')] == []
    with pytest.raises(chainiter.IteratorFinalizedError):
        next(it)


@pytest.mark.parametrize('value', ['thread', 'gpu'])
def test_an_unknown_loading_place_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv('CHAINITER_THREAD_LOADING', value)
    with pytest.raises(ValueError, match='CHAINITER_THREAD_LOADING') as info:
        MultithreadIterator(Ragged(), 4)
    assert 'auto, threads, main' in str(info.value)


def test_threads_pinned_never_load_in_the_main_thread(monkeypatch):
    monkeypatch.setenv('CHAINITER_THREAD_LOADING', 'threads')
    with Switching(Ragged(), 8, n_threads=2) as it:
        for _ in range(40):
            next(it)
            assert it.stats['loads_in'] == 'workers'


@pytest.mark.parametrize('converter', [None, concat_examples])
def test_an_error_in_a_group_comes_from_the_batch_that_holds_it(
        in_main, monkeypatch, converter):
    # Small batches go in groups of 4 once measured; the batches before
    # the bad example's come, then its error, from its own batch.
    monkeypatch.setattr(MultithreadIterator, 'GROUP_AFTER', 2)
    monkeypatch.setattr(MultithreadIterator, 'GROUP_S', 10.0)
    monkeypatch.setattr(MultithreadIterator, 'MAX_GROUP', 4)
    class Rows:
        def __len__(self):
            return 2000

        def __getitem__(self, i):
            if i == 1205:
                raise KeyError('broken example 1205')
            return numpy.full(16, i, dtype=numpy.float32), i

    with MultithreadIterator(Rows(), 4, n_threads=2, shuffle=False,
                             converter=converter) as it, \
            SerialIterator(Rows(), 4, shuffle=False) as ref:
        grouped = 1
        for k in range(301):
            got, want = next(it), next(ref)
            if converter is not None:
                want = converter(want)
            assert fingerprint(got) == fingerprint(want), k
            grouped = max(grouped, it.stats['batches_per_task'])
        # (The group that holds the bad example, loaded ahead, ended the
        # groups.)
        assert grouped > 1
        with pytest.raises(KeyError, match='broken example 1205'):
            next(it)
        assert it.current_position == 1204
