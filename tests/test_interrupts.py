"""Ctrl-C inside next(): KeyboardInterrupt propagates and the iterator is
left where it was.  A thread sends SIGINT to the main thread at random
moments; the handler raises KeyboardInterrupt only where the test means to
interrupt (an interrupt that lands in the test's own loop would lose the
batch there, which no iterator can help):

anywhere inside next(), for every kind and start method: while it waits
for the workers (where a user's Ctrl-C lands most often), while it sends
them tasks or shared memory, while it hands the batch out.
"""

import functools
import gc
import os
import random
import signal
import threading

import pytest

from chainiter import MultiprocessIterator, MultithreadIterator, SerialIterator

from helpers import (
    START_METHODS, AugmentedDataset, fingerprint, mapped_buffers, shm_files)

KINDS = dict(
    [('serial', SerialIterator),
     ('thread', functools.partial(MultithreadIterator, n_threads=2))]
    + [('mp-' + m, functools.partial(MultiprocessIterator, n_processes=2,
                                     n_prefetch=3, start_method=m))
       for m in START_METHODS])

MIN_BATCHES = 150
MAX_BATCHES = 100000


def _inside_next(frame, iterator):
    """Inside ``iterator.__next__``, and not in a finalizer that garbage
    collection runs there (Python reports an exception raised in one as
    ignored, whoever's it is)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == '__del__' or code.co_filename.endswith((
                'unraisableexception.py', 'weakref.py', '_weakrefset.py')) \
                or (code.co_name == '__call__' and code.co_filename.endswith(
                    os.path.join('multiprocessing', 'util.py'))):
            return False
        if code.co_name == '__next__' and \
                frame.f_locals.get('self') is iterator:
            return True
        frame = frame.f_back
    return False


@pytest.mark.parametrize('kind', list(KINDS))
def test_interrupts_inside_next_lose_no_batch(kind):
    dataset = AugmentedDataset(23)
    counts = {'raised': 0, 'outside': 0}
    target = []

    def handler(signum, frame):
        if target and _inside_next(frame, target[0]):
            counts['raised'] += 1
            raise KeyboardInterrupt
        counts['outside'] += 1

    stop = threading.Event()
    main = threading.main_thread().ident
    rng = random.Random(0)

    def fire():
        while not stop.wait(rng.uniform(0, 0.002)):
            signal.pthread_kill(main, signal.SIGINT)

    files = shm_files()
    buffers = mapped_buffers()
    previous = signal.signal(signal.SIGINT, handler)
    firing = threading.Thread(target=fire, daemon=True)
    batches = 0
    try:
        with KINDS[kind](dataset, 5, seed=8) as it, \
                SerialIterator(dataset, 5, seed=8) as ref:
            target.append(it)
            firing.start()
            # At least MIN_BATCHES, and on until 30 interrupts landed.
            while batches < MIN_BATCHES or (
                    counts['raised'] < 30 and batches < MAX_BATCHES):
                try:
                    got = fingerprint(next(it))
                except KeyboardInterrupt:
                    continue
                assert got == fingerprint(next(ref)), (batches, counts)
                batches += 1
            stop.set()
            firing.join(10)
    finally:
        stop.set()
        signal.signal(signal.SIGINT, previous)
    assert counts['raised'] >= 30, counts      # it was really interrupted
    assert shm_files() <= files                 # no file left behind
    gc.collect()
    assert mapped_buffers() == buffers          # no mapping, no descriptor
