"""Ctrl-C inside next(): KeyboardInterrupt propagates and the iterator is
left where it was.  A thread sends SIGINT to the main thread at random
moments; the handler raises KeyboardInterrupt only where the test means to
interrupt (an interrupt that lands in the test's own loop would lose the
batch there, which no iterator can help):

anywhere inside next(), for every kind and start method: while it waits
for the workers (where a user's Ctrl-C lands most often), while it sends
them tasks or shared memory, while it hands the batch out.  The 'default'
kinds use the default depth with small batches joined in groups early on,
so interrupts also land while buffers are replaced and released.
"""

import contextlib
import functools
import gc
import mmap
import os
import random
import signal
import threading
import time

import numpy
import pytest

from chainiter import (
    DevicePrefetcher, IteratorFinalizedError, MultiprocessIterator,
    MultithreadIterator, SerialIterator, concat_examples)
from chainiter._interrupts import uninterrupted
from chainiter.iterators.pipeline.memory.shm import SharedBuffer

import helpers
from helpers import (
    START_METHODS, AugmentedDataset, fingerprint, mapped_buffers, shm_files)


class _Grouped(MultiprocessIterator):
    # Groups from the third batch on (tests/test_groups.py).
    GROUP_AFTER = 2
    GROUP_S = 10.0
    MAX_GROUP = 4


class _Switching(MultithreadIterator):
    # Loads in its threads and in the main thread by turns, switching
    # every few batches (a build with the GIL: tests/test_thread_loading.py).
    LOADING_FIRST_PROBE_S = 0.0
    LOADING_WINDOW_S = 0.0
    LOADING_WINDOW_BATCHES = 1


KINDS = dict(
    [('serial', SerialIterator),
     ('thread', functools.partial(MultithreadIterator, n_threads=2)),
     ('thread-switching', functools.partial(_Switching, n_threads=2))]
    + [('mp-' + m, functools.partial(MultiprocessIterator, n_processes=2,
                                     n_prefetch=3, start_method=m))
       for m in START_METHODS]
    + [('mp-default-' + m, functools.partial(
        _Grouped, n_processes=2, start_method=m, converter=concat_examples))
       for m in START_METHODS])

MIN_BATCHES = 150
MAX_BATCHES = 100000


def _inside(frame, iterator, names=('__next__',)):
    """Inside one of ``names``, methods of ``iterator``, and not in a
    finalizer that garbage collection runs there (Python reports an
    exception raised in one as ignored, whoever's it is)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == '__del__' or code.co_filename.endswith((
                'unraisableexception.py', 'weakref.py', '_weakrefset.py')) \
                or (code.co_name == '__call__' and code.co_filename.endswith(
                    os.path.join('multiprocessing', 'util.py'))):
            return False
        if code.co_name in names and frame.f_locals.get('self') is iterator:
            return True
        frame = frame.f_back
    return False


class _Timeout(Exception):
    """What a timeout's SIGALRM handler raises."""


# The signals of the storms, and what their handlers raise.
SIGNALS = {'SIGINT': KeyboardInterrupt, 'SIGALRM': _Timeout}


@contextlib.contextmanager
def _signal_storm(names, seed, max_gap, signame='SIGINT'):
    """A thread sends SIGINT (or ``signame``) to the main thread every 0 to
    ``max_gap`` seconds; the handler raises KeyboardInterrupt (or what
    SIGNALS says) where the main thread is inside one of ``names`` of the
    iterator put in ``target``.  Yields ``(counts, target)``;
    ``counts['raised']`` counts those raised."""
    counts = {'raised': 0, 'outside': 0}
    target = []
    sent, error = getattr(signal, signame), SIGNALS[signame]

    def handler(signum, frame):
        if target and _inside(frame, target[0], names):
            counts['raised'] += 1
            raise error
        counts['outside'] += 1

    stop = threading.Event()
    main = threading.main_thread().ident
    rng = random.Random(seed)

    def fire():
        while not stop.wait(rng.uniform(0, max_gap)):
            signal.pthread_kill(main, sent)

    previous = signal.signal(sent, handler)
    firing = threading.Thread(target=fire, daemon=True)
    firing.start()
    try:
        yield counts, target
        stop.set()
        firing.join(10)
    finally:
        stop.set()
        signal.signal(sent, previous)


@pytest.mark.parametrize('signame', list(SIGNALS))
@pytest.mark.parametrize('kind', list(KINDS))
def test_interrupts_inside_next_lose_no_batch(kind, signame):
    # A Ctrl-C, or a timeout's SIGALRM whose handler raises (as a
    # timeout that retries next() would), anywhere inside next().
    dataset = AugmentedDataset(23)
    files = shm_files()
    buffers = mapped_buffers()
    batches = 0
    with _signal_storm(('__next__',), 0, 0.002, signame) as (
            counts, target), \
            KINDS[kind](dataset, 5, seed=8) as it, \
            SerialIterator(dataset, 5, seed=8) as ref:
        target.append(it)
        # At least MIN_BATCHES, and on until 30 interrupts landed.
        while batches < MIN_BATCHES or (
                counts['raised'] < 30 and batches < MAX_BATCHES):
            try:
                got = fingerprint(next(it))
            except SIGNALS[signame]:
                continue
            want = next(ref)
            if kind.startswith('mp-default'):
                want = concat_examples(want)
            assert got == fingerprint(want), (batches, counts)
            batches += 1
        target.clear()          # the storm goes on while the with ends
    assert counts['raised'] >= 30, counts      # it was really interrupted
    assert shm_files() <= files                 # no file left behind
    gc.collect()
    assert mapped_buffers() == buffers          # no mapping, no descriptor


@pytest.mark.parametrize('kind', [
    kind for kind in KINDS if not kind.startswith('mp-default')])
def test_interrupts_inside_a_prefetchers_next_lose_no_batch(kind):
    # Anywhere inside DevicePrefetcher.__next__: while the wrapped
    # iterator loads, while the batch is converted and its state read,
    # while it is handed out.
    dataset = AugmentedDataset(23)
    batches = 0
    with _signal_storm(('__next__',), 1, 0.002) as (counts, target), \
            DevicePrefetcher(KINDS[kind](dataset, 5, seed=8),
                             depth=2) as it, \
            SerialIterator(dataset, 5, seed=8) as ref:
        target.append(it)
        # A Ctrl-C lands where a batch was taken from the wrapped iterator
        # and not yet handed out in a few of them: 100 interrupts.
        while batches < MIN_BATCHES or (
                counts['raised'] < 100 and batches < MAX_BATCHES):
            position = (it.epoch, it.current_position)
            try:
                got = fingerprint(next(it))
            except KeyboardInterrupt:
                assert (it.epoch, it.current_position) == position
                continue
            assert got == fingerprint(concat_examples(next(ref))), (
                batches, counts)
            batches += 1
        target.clear()
    assert counts['raised'] >= 100, counts


@pytest.mark.parametrize('grouped', [False, True], ids=['batches', 'groups'])
def test_a_ctrl_c_while_next_waits_keeps_the_batches_loaded_ahead(
        method, grouped, tmp_path):
    """A Ctrl-C while next() waits for a slow batch (where a user's
    lands most often) leaves the batches in flight and loaded ahead as
    they are: the next call waits for the same batch, and no example is
    loaded twice.  Example ``gated`` waits until the test releases it,
    after the Ctrl-C, so that the worker loading it is still at it."""
    n, size = 200, 4
    gated = 20 * size     # the first example of batch 20
    log, release = str(tmp_path / 'loads'), str(tmp_path / 'release')
    dataset = helpers.LoggedLoads(n, log, gated, release)
    if grouped:     # in groups of four batches from the third on
        make = functools.partial(_Grouped, converter=concat_examples)
    else:
        make = functools.partial(MultiprocessIterator, n_prefetch=6)
    main = threading.main_thread()
    go = threading.Event()
    sent = []

    def loaded_ahead():
        # An example of the batches after the gated one is loaded.
        return (helpers.logged_loads(log) >= gated + size).any()

    def interrupt():
        # Once next() blocks in the pool's wait for the gated batch, and
        # a worker has loaded beyond it.
        pause = threading.Event()
        deadline = time.monotonic() + 60
        while not loaded_ahead() and time.monotonic() < deadline:
            pause.wait(0.005)
        if go.wait(60) and helpers.wait_until_blocked_in(
                main, 'wait', os.path.join('pool', 'pool.py'), 60):
            sent.append(True)
            signal.pthread_kill(main.ident, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with make(dataset, size, repeat=False, shuffle=False,
                  n_processes=2, start_method=method) as it:
            got = [next(it) for _ in range(gated // size)]
            firing = threading.Thread(target=interrupt, daemon=True)
            firing.start()
            go.set()
            with pytest.raises(KeyboardInterrupt):
                next(it)
            firing.join(60)
            assert sent and loaded_ahead()
            with open(release, 'w'):
                pass
            got += list(it)
    finally:
        signal.signal(signal.SIGINT, previous)
    want = list(SerialIterator(list(range(n)), size, repeat=False,
                               shuffle=False))
    if grouped:
        want = [concat_examples(batch) for batch in want]
    assert [fingerprint(b) for b in got] == [fingerprint(b) for b in want]
    # Each example loaded once: nothing in flight was loaded again.
    loads = numpy.bincount(helpers.logged_loads(log), minlength=n)
    assert loads.tolist() == [1] * n, numpy.flatnonzero(loads != 1)


def test_an_interrupt_waits_for_the_end_of_an_uninterrupted_block():
    """Whichever thread the kernel gives the signal to (here another
    thread sends it to the process), the handler runs after the block, in
    the main thread, once."""
    ran = []
    calls = []
    previous = signal.signal(signal.SIGINT, lambda s, f: calls.append(s))
    try:
        with uninterrupted():
            signal.raise_signal(signal.SIGINT)
            sender = threading.Thread(target=os.kill,
                                      args=(os.getpid(), signal.SIGINT))
            sender.start()
            sender.join()
            with uninterrupted():       # nested: nothing changes
                signal.raise_signal(signal.SIGINT)
            ran.append('block')
            assert calls == []
        assert calls == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is not None
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with pytest.raises(KeyboardInterrupt):
            with uninterrupted():
                signal.raise_signal(signal.SIGINT)
                ran.append('to the end')
        assert ran == ['block', 'to the end']
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_other_signals_are_held_back_in_the_order_they_came():
    # A timeout's SIGALRM handler raises too: inside a block it waits, as
    # a Ctrl-C does; after the block each handler runs once, in the order
    # the signals came, and the first exception goes up.
    calls = []

    def on_alarm(signum, frame):
        calls.append(signum)
        raise _Timeout

    previous = signal.signal(signal.SIGINT, lambda s, f: calls.append(s))
    previous_alarm = signal.signal(signal.SIGALRM, on_alarm)
    try:
        with pytest.raises(_Timeout):
            with uninterrupted():
                signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGALRM)
                signal.raise_signal(signal.SIGINT)
                assert calls == []
        assert calls == [signal.SIGINT, signal.SIGALRM]
        assert signal.getsignal(signal.SIGALRM) is on_alarm
        del calls[:]
        with pytest.raises(_Timeout):
            with uninterrupted():
                signal.raise_signal(signal.SIGALRM)
                signal.raise_signal(signal.SIGINT)
        assert calls == [signal.SIGALRM, signal.SIGINT]
        with uninterrupted():       # nothing held from before
            pass
        assert calls == [signal.SIGALRM, signal.SIGINT]
        assert uninterrupted.saved is None and uninterrupted.held == []
    finally:
        signal.signal(signal.SIGALRM, previous_alarm)
        signal.signal(signal.SIGINT, previous)


def test_an_interrupt_held_back_is_not_seen_twice_through_a_wakeup_fd():
    # asyncio's add_signal_handler() reads signals from a wakeup fd: one
    # Ctrl-C inside a block must write it one byte, as outside.
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    previous = signal.signal(signal.SIGINT, lambda s, f: None)
    old_fd = signal.set_wakeup_fd(w)
    try:
        with uninterrupted():
            signal.raise_signal(signal.SIGINT)
        assert os.read(r, 16) == bytes([signal.SIGINT])
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGINT, previous)
        os.close(r)
        os.close(w)


def test_a_process_forked_inside_a_block_handles_ctrl_c():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with uninterrupted():
            pid = os.fork()
            if pid == 0:        # the child: its handler is the user's
                os._exit(0 if signal.getsignal(signal.SIGINT) is
                         signal.default_int_handler else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_just_after_a_buffer_closes_its_descriptor(monkeypatch):
    """A Ctrl-C that lands as soon as ``os.close`` returns leaves the
    buffer released: its descriptor is closed once, never again (by then
    its number may be another file's)."""
    shared = SharedBuffer.allocate(4096)
    closed = []
    real_close = os.close

    def close(fd):
        real_close(fd)
        closed.append(fd)
        signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        monkeypatch.setattr(os, 'close', close)
        with pytest.raises(KeyboardInterrupt):
            shared.release()
        monkeypatch.undo()
        fd = shared.fd
        shared.release()
        shared.close()
    finally:
        monkeypatch.undo()
        signal.signal(signal.SIGINT, previous)
    assert len(closed) == 1 and fd == -1
    assert shared.buffer is None


class _SlowAugmented(AugmentedDataset):
    """AugmentedDataset's examples, each costing 1 ms: batches are in
    flight while the iterator resets or loads a snapshot."""

    def __getitem__(self, i):
        time.sleep(0.001)          # the cost of loading, not a wait
        return super().__getitem__(i)


@pytest.mark.parametrize('kind', ['mp-' + m for m in START_METHODS])
def test_interrupts_inside_reset_and_snapshot_loads(kind):
    """A Ctrl-C inside reset() or a snapshot's load leaves the iterator
    either as it was or reset (loaded): never half of it, never waiting
    for batches it dropped, never handing out another batch's arrays."""
    dataset = _SlowAugmented(23)
    files = shm_files()
    with _signal_storm(('reset', 'load_state_dict'), 1, 0.001) as (
            counts, target), \
            KINDS[kind](dataset, 5, seed=8) as it, \
            SerialIterator(dataset, 5, seed=8) as ref:
        target.append(it)
        step = 0
        while step < 40 or (counts['raised'] < 10 and step < 2000):
            step += 1
            before = it.state_dict()
            try:
                if step % 2:
                    it.reset()
                else:
                    it.load_state_dict(before)
            except KeyboardInterrupt:
                pass
            after = it.state_dict()
            if step % 2 and after != before:
                # Reset after all: all of it.
                assert after['reset_count'] == \
                    before['reset_count'] + 1, (before, after)
                assert after['current_position'] == 0
                ref.reset()
            else:
                assert after == before
            assert fingerprint(next(it)) == fingerprint(next(ref)), \
                (step, counts)
        target.clear()
    assert counts['raised'] >= 10, counts
    assert shm_files() <= files


@pytest.mark.parametrize('method', START_METHODS)
def test_a_ctrl_c_while_the_dataset_arrays_are_copied(method, monkeypatch):
    """A Ctrl-C that lands while the arrays of a dataset are copied into
    shared memory (the first workers are starting meanwhile) stops the
    constructor: no worker is left, nothing in /dev/shm, the array keeps
    its values in private memory, and a new iterator works."""
    if method == 'fork':
        pytest.skip('forked workers share the memory: nothing is copied')
    page = mmap.PAGESIZE
    dataset = helpers.ReadsArrayWhenUnpickled(16)
    expected = dataset.data.copy()
    writes = []
    real_pwrite = os.pwrite

    def pwrite(fd, data, offset):
        n = real_pwrite(fd, data, offset)
        writes.append(n)
        if n >= page:
            signal.raise_signal(signal.SIGINT)
        return n

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        monkeypatch.setattr(os, 'pwrite', pwrite)
        with pytest.raises(KeyboardInterrupt):
            MultiprocessIterator(dataset, 4, n_processes=2,
                                 start_method=method)
        monkeypatch.undo()
    finally:
        monkeypatch.undo()
        signal.signal(signal.SIGINT, previous)
    assert max(writes) >= page
    assert not helpers.worker_pids()      # joined before the raise
    assert helpers.shared_mapping_of(dataset.data) is None
    assert numpy.array_equal(dataset.data, expected)
    assert not shm_files()
    with MultiprocessIterator(dataset, 4, n_processes=2,
                              start_method=method) as it:
        assert next(it) == [dataset.total] * 4


def _inside_finalize(frame, iterator):
    """Anywhere inside ``iterator.finalize()``: the pool's close that its
    finalizer runs too."""
    while frame is not None:
        if frame.f_code.co_name == 'finalize' and \
                frame.f_locals.get('self') is iterator:
            return True
        frame = frame.f_back
    return False


@pytest.mark.parametrize('method', START_METHODS)
def test_a_ctrl_c_anywhere_in_finalize_leaves_nothing_behind(method):
    """Ctrl-Cs land inside finalize() every 0-1 ms, wherever it is, and
    the program calls finalize() again after each KeyboardInterrupt, as a
    `with` block's exit would not: whatever was torn, no worker is left,
    nothing is mapped or in /dev/shm, and the dataset's array is private
    and unchanged."""
    gc.collect()
    files, buffers = shm_files(), mapped_buffers()
    dataset = helpers.ReadsArrayWhenUnpickled(16)
    expected = dataset.data.copy()
    raised = 0
    for seed in range(3):
        it = MultiprocessIterator(dataset, 4, n_processes=2,
                                  start_method=method)
        assert next(it) == [dataset.total] * 4
        pids = helpers.worker_pids()
        stop = threading.Event()
        main = threading.main_thread().ident
        rng = random.Random(seed)

        def handler(signum, frame):
            if _inside_finalize(frame, it):
                raise KeyboardInterrupt

        def fire():
            while not stop.wait(rng.uniform(0, 0.001)):
                signal.pthread_kill(main, signal.SIGINT)

        previous = signal.signal(signal.SIGINT, handler)
        firing = threading.Thread(target=fire, daemon=True)
        firing.start()
        try:
            for _ in range(100):
                try:
                    it.finalize()
                    break
                except KeyboardInterrupt:
                    raised += 1
        finally:
            stop.set()
            firing.join(10)
            signal.signal(signal.SIGINT, previous)
        with pytest.raises(IteratorFinalizedError):
            next(it)
        assert helpers.wait_processes_gone(pids, 30), pids
        del it
    assert raised, 'no Ctrl-C landed inside finalize()'
    gc.collect()
    assert not helpers.worker_pids()
    assert shm_files() <= files
    assert mapped_buffers() == buffers
    assert helpers.shared_mapping_of(dataset.data) is None
    assert numpy.array_equal(dataset.data, expected)
