"""``MultithreadIterator`` on the pipeline of ``MultiprocessIterator``:
batches written by the threads into reused buffers of the process's own
memory (no shared-memory file, nothing pickled), groups of small
batches, errors with their traceback and index, resume across kinds,
and threads that end with ``finalize()``.  (The batches of every example
kind: test_fuzz_batches.py and test_list_batches.py.)"""

import functools
import gc
import os
import pickle
import sys
import threading
import warnings

import numpy
import pytest

import chainiter
from chainiter import (
    MultiprocessIterator, MultithreadIterator, SerialIterator,
    concat_examples)

import helpers
from helpers import Failing, assert_resume_equivalent, fingerprint, take

pytestmark = pytest.mark.timeout(60)


def _shm_descriptors():
    """Descriptors of this process that are files in /dev/shm (chainiter's
    buffers there are unlinked as they are made: only a descriptor or a
    mapping shows them)."""
    found = set()
    for name in os.listdir('/proc/self/fd'):
        try:
            target = os.readlink('/proc/self/fd/' + name)
        except OSError:
            continue
        if target.startswith('/dev/shm/'):
            found.add(target)
    return found


def _shm_mappings():
    with open('/proc/self/maps') as maps:
        return {line.split(None, 5)[-1].strip() for line in maps
                if '/dev/shm/' in line}


class Tiny:
    def __len__(self):
        return 600

    def __getitem__(self, i):
        return numpy.full(16, i, dtype=numpy.float32), i


def _workers_alive():
    return [t for t in threading.enumerate()
            if t.name.startswith('chainiter-worker-')]


@pytest.mark.parametrize('converter', [None, concat_examples])
def test_threads_write_batches_into_reused_memory_of_the_process(converter):
    before = _shm_descriptors(), _shm_mappings()
    with SerialIterator(Tiny(), 8, seed=1) as serial, \
            MultithreadIterator(Tiny(), 8, n_threads=2, seed=1,
                                converter=converter) as it:
        for k in range(200):
            expected = next(serial)
            if converter is not None:
                expected = converter(expected)
            assert fingerprint(next(it)) == fingerprint(expected), k
            assert (_shm_descriptors(), _shm_mappings()) == before
        stats = it.stats
    # Written by the threads (only the first batch, which sizes the
    # buffers, comes whole), and in groups of small batches.
    assert stats['by_copy'] == 1
    assert stats['batches_per_task'] > 1
    assert _workers_alive() == []


@pytest.mark.parametrize('where', ['threads', 'main'])
def test_a_batch_held_is_never_overwritten(monkeypatch, where):
    # In the threads, or in the main thread (tests/test_thread_loading.py).
    monkeypatch.setenv('CHAINITER_THREAD_LOADING', where)
    with MultithreadIterator(Tiny(), 4, n_threads=2, shuffle=False,
                             converter=concat_examples) as it:
        held = [next(it) for _ in range(300)]
    for k, (x, t) in enumerate(held):
        rows = numpy.arange(4 * k, 4 * k + 4) % 600
        assert (t == rows).all(), k
        assert (x == rows[:, None]).all(), k


def test_an_error_comes_with_its_traceback_and_index_and_the_position_stays():
    with MultithreadIterator(Failing(20, bad=9), 4, n_threads=2,
                             shuffle=False) as it:
        assert fingerprint(next(it)) == fingerprint(
            [numpy.full(4, i) for i in range(4)])
        next(it)
        with pytest.raises(KeyError, match='broken example 9') as info:
            next(it)
        assert 'Failing' in str(info.value.__cause__) or \
            '__getitem__' in str(info.value.__cause__)
        notes = getattr(info.value, '__notes__', ['dataset[9]'])
        assert any('dataset[9]' in note for note in notes)
        assert it.current_position == 8      # the batch that failed is next
        with pytest.raises(KeyError):
            next(it)


# (pytest reports each thread's uncaught exception: here they are the test.)
@pytest.mark.filterwarnings(
    'ignore::pytest.PytestUnhandledThreadExceptionWarning')
def test_a_thread_that_an_exception_ends_is_named_as_a_thread():
    # dataset[13] raises SystemExit: the thread loading it ends.
    it = MultithreadIterator(helpers.Faulty(40, 13, 'systemexit'), 4,
                             n_threads=2, shuffle=False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            assert fingerprint([next(it) for _ in range(3)]) == fingerprint(
                [[numpy.full(3, i) for i in range(k, k + 4)]
                 for k in range(0, 12, 4)])
            with pytest.raises(chainiter.WorkerDiedError) as info:
                next(it)
    finally:
        it.finalize()
    deaths = [str(w.message) for w in caught
              if issubclass(w.category, chainiter.WorkerRestartWarning)]
    assert deaths
    for message in deaths + [str(info.value)]:
        assert 'process' not in message and 'pid' not in message, message
        assert 'ended with an uncaught SystemExit: 3' in message, message
    assert 'dataset indices [12, 13, 14, 15]' in str(info.value)
    assert it.current_position == 12     # the batch that failed is next
    assert _workers_alive() == []


def test_worker_init_fn_that_raises_is_the_error_of_next():
    def init(worker_id):
        raise ValueError('no init for {}'.format(worker_id))

    it = MultithreadIterator(list(range(8)), 2, n_threads=2,
                             worker_init_fn=init)
    try:
        with pytest.raises(chainiter.ChainiterError,
                           match='worker_init_fn.*raised'):
            next(it)
    finally:
        it.finalize()
    assert _workers_alive() == []


# Ragged examples outgrow the processes' first buffers: they warn.
@pytest.mark.filterwarnings('ignore::chainiter.errors.SharedMemoryWarning')
@pytest.mark.parametrize('converter', [
    None, concat_examples, functools.partial(concat_examples, padding=-1)])
def test_resume_across_kinds(converter):
    # Ragged but where concat_examples stacks without padding.
    ragged = converter is not concat_examples

    class Ragged:
        def __len__(self):
            return 37

        def __getitem__(self, i):
            rng = chainiter.example_rng()
            return numpy.arange(1 + i % 5 if ragged else 3,
                                dtype=numpy.int32), float(rng.random())

    kinds = [
        functools.partial(MultithreadIterator, n_threads=2,
                          converter=converter),
        functools.partial(MultiprocessIterator, n_processes=2,
                          start_method='fork', converter=converter),
        SerialIterator if converter is None else None,
    ]
    makes = [functools.partial(make, Ragged(), 6, seed=11)
             for make in kinds if make is not None]
    assert_resume_equivalent(makes[0], makes, 9)
    assert_resume_equivalent(makes[1], makes[:1], 9)


def test_a_copy_and_a_pickle_load_on_from_the_same_state():
    with MultithreadIterator(Tiny(), 8, n_threads=2, seed=4) as it:
        take(it, 5)
        clone = pickle.loads(pickle.dumps(it))
        with clone:
            assert take(clone, 20) == take(it, 20)


def test_finalize_ends_the_threads_while_batches_are_in_flight():
    it = MultithreadIterator(Tiny(), 8, n_threads=3)
    next(it)
    assert len(_workers_alive()) == 3
    it.finalize()
    assert _workers_alive() == []
    with pytest.raises(chainiter.IteratorFinalizedError):
        next(it)


def test_threads_leave_the_global_random_generators_alone():
    class Draws:
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return chainiter.example_rng().integers(1 << 30)

    numpy.random.seed(3)
    expected = numpy.random.random_sample()
    numpy.random.seed(3)
    with MultithreadIterator(Draws(), 8, n_threads=2, seed=0) as it, \
            SerialIterator(Draws(), 8, seed=0) as serial:
        assert take(it, 16) == take(serial, 16)
        assert numpy.random.random_sample() == expected


# A fork copies only the forking thread: a lock another thread holds in
# numpy at that moment stays held in the child.  With the GIL the worker
# threads hold none between the GIL's hand-offs; on a free-threaded
# build they may, and the child's first numpy call can wait forever.
_forks_with_threads = pytest.mark.skipif(
    not getattr(sys, '_is_gil_enabled', lambda: True)(),
    reason='a fork while threads run numpy may leave its locks held in the '
    'child on a free-threaded build')


@_forks_with_threads
def test_a_batch_a_forked_child_holds_is_never_overwritten():
    # The threads' buffers are private memory: the child has its copy.
    with MultithreadIterator(Tiny(), 4, n_threads=2, shuffle=False,
                             converter=concat_examples) as it:
        next(it)                   # the first batch comes whole
        batch = next(it)           # a view of a buffer
        verdict = helpers.fork_reader(batch)
        del batch
        gc.collect()
        for _ in range(60):        # the buffers are reused many times over
            next(it)
        assert verdict()


@_forks_with_threads
def test_a_forked_child_loads_on_with_threads_of_its_own():
    with MultithreadIterator(Tiny(), 8, n_threads=2, seed=2) as it, \
            SerialIterator(Tiny(), 8, seed=2) as serial:
        take(it, 3)
        take(serial, 3)
        expected = take(serial, 5)
        read_r, write_w = os.pipe()
        with warnings.catch_warnings():
            # A fork of a process with threads: the child starts its own.
            warnings.simplefilter('ignore', DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            try:
                same = take(it, 5) == expected
                it.finalize()
                os.write(write_w, b'1' if same else b'0')
            finally:
                os._exit(0)
        os.close(write_w)
        got = os.read(read_r, 1)
        os.close(read_r)
        os.waitpid(pid, 0)
        assert got == b'1'
        assert take(it, 5) == expected      # the parent's threads go on


def test_iterators_that_come_and_go_leave_no_descriptor_open():
    def descriptors():
        return len(os.listdir('/proc/self/fd'))

    with MultithreadIterator(Tiny(), 8, n_threads=3) as it:
        take(it, 5)
    before = descriptors()
    for _ in range(20):
        with MultithreadIterator(Tiny(), 8, n_threads=3) as it:
            take(it, 5)
    assert descriptors() == before
