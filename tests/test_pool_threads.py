"""The pool's thread discipline (the "Threads" table of
chainiter/iterators/pipeline/__init__.py), seen from what a user's
code can run in the main process."""

import threading

import pytest

import chainiter

# The iterator whose pool the examples below look at as they are
# unpickled (in the main process: the workers only pickle them).
_ITERATOR = None
_SEEN = []


def _unpickled(i):
    """Reconstructs a ``Probe`` in the main process, noting whether the
    thread that unpickles it could take the pool's lock: the receiver
    thread must unpickle a worker's results before it takes it (a user's
    ``__setstate__`` may take long, and the main thread's ``next()``
    would wait on it)."""
    if threading.current_thread().name == 'chainiter-receiver' and \
            all(_SEEN):
        lock = _ITERATOR._pool.lock
        # Not reentrant: the receiver thread holding it waits here
        # until the timeout; the main thread holds it only a moment.
        taken = lock.acquire(timeout=2)
        if taken:
            lock.release()
        _SEEN.append(taken)
    return Probe(i)


class Probe:
    def __init__(self, i):
        self.i = i

    def __reduce__(self):
        return _unpickled, (self.i,)


class Probes:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return Probe(i)


def test_results_are_unpickled_without_the_pool_lock(method):
    global _ITERATOR
    _SEEN.clear()
    it = chainiter.MultiprocessIterator(
        Probes(), 4, shuffle=False, n_processes=1, n_prefetch=1,
        start_method=method)
    _ITERATOR = it
    try:
        batches = [next(it) for _ in range(2)]
    finally:
        it.finalize()
        _ITERATOR = None
    assert [[p.i for p in batch] for batch in batches] == [
        [0, 1, 2, 3], [4, 5, 6, 7]]
    assert _SEEN and all(_SEEN), _SEEN
