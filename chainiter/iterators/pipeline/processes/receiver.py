"""The receiver thread: the only thread that reads from the workers.

It waits on every worker's socket (to read results; to write too while
its outbox holds messages), on the launcher (exits) and on a wake-up pipe,
all at once, and submits what the main thread posted.  It rests while
enough finished batches wait for the consumer (results then pile up in
the sockets and one wake-up reads several, instead of one wake-up per
result), or when no batch is loading.  It never rests while a message
waits in an outbox or a task waits for a worker, or when it was asked to
look at the workers.  Resting, it waits on a lock, not on the sockets
(see ``_write_wake_up``), and looks at the sockets every ``POLL_S``.
"""

import os
import pickle
import selectors
import signal
import threading

from chainiter.errors import ChainiterError
from chainiter.iterators.pipeline.flow import remote
from chainiter.iterators.pipeline.pool.pool import POLL_S
from chainiter.iterators.pipeline.processes.wire import (
    load_result, receive_results)
from chainiter.iterators.pipeline.processes.worker import (
    NO_ROOM, STARTED, STARTUP_FAILED)

# It rests while this many batches wait for the consumer, until fewer than
# _READY_LOW do.
_READY_HIGH = 4
_READY_LOW = 2
_JOIN_TIMEOUT_S = 5.0


class Receiver:

    def __init__(self, pool):
        # A weak link would do as well: the pool owns the receiver and
        # outlives its thread (close() stops it).
        self._pool = pool
        self._stop = threading.Event()
        # A plain flag and the wake-up pipe, not a threading.Event: the
        # main thread, where a KeyboardInterrupt may land, must never take
        # a lock written in Python (an interrupt between acquiring and the
        # with block leaves it held, and this thread waits forever).
        self._wanted = True
        self._check = True      # replenish workers at the next look
        self._dirty = True      # bring the selector up to date
        self._writing = False   # some socket is watched for room to write
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # Resting, it waits on this lock instead, held while no wake-up is
        # pending (see _write_wake_up).
        self._signal = threading.Lock()
        self._signal.acquire()
        self._on_signal = False     # it rests on _signal, not the pipe
        self._thread = threading.Thread(
            target=self._run, name='chainiter-receiver', daemon=True)

    # ---- for the other threads ---------------------------------------------

    def start(self):
        self._thread.start()

    def is_alive(self):
        return self._thread.is_alive()

    def wake(self):
        self._dirty = True      # the workers or their outboxes changed
        self._write_wake_up()

    @property
    def resting(self):
        """It may be resting: a result need not wake it."""
        return not self._wanted

    @property
    def sleeping(self):
        """It rests now, on the lock that a wake-up releases."""
        return self._on_signal

    def nudge(self):
        """Stop resting and submit what was posted (``Pool.post``)."""
        self._wanted = True
        self._write_wake_up()

    def _write_wake_up(self):
        # The lock first, then the pipe unless the thread rests on the
        # lock (it sets _on_signal before it looks at the lock, and clears
        # it before it looks at the lock again on its way to the pipe:
        # no wake-up is lost).  Releasing the lock keeps the GIL: the
        # woken thread waits for it until this thread blocks or returns
        # to its training step.  A write to the pipe lets go of the GIL in
        # the call, and the thread it wakes (on this CPU, at once, since
        # the kernel expects the writer to sleep) took it and ran its
        # 0.1-0.4 ms of submission inside the caller's next().  The main
        # thread never holds the lock: an interrupt cannot leave it held.
        try:
            self._signal.release()
        except RuntimeError:
            pass       # released already: a wake-up is pending
        if self._on_signal:
            return
        try:
            os.write(self._wake_w, b'w')
        except OSError:
            pass       # full (a wake-up waits already) or closed

    def want(self):
        """Stop resting, look now, and start workers if too few take
        tasks."""
        self._check = True
        self._wanted = True
        self.wake()

    def retry_later(self):
        """Look again at the next wake-up (within POLL_S)."""
        self._check = True

    def consumed(self):
        """The consumer took a batch: stop resting when few are left."""
        if not self._wanted and self._pool.ready.qsize() < _READY_LOW:
            self._wanted = True
            self.wake()

    def stop(self):
        self._stop.set()
        self.want()
        if threading.current_thread() is not self._thread:
            self._thread.join(_JOIN_TIMEOUT_S)

    def close(self):
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ---- the thread --------------------------------------------------------

    def _may_rest(self):
        pool = self._pool
        return (pool.ready.qsize() >= _READY_HIGH or
                not pool.book.inflight) and not self._check and \
            not pool.posted and not pool.book.unassigned and \
            not any(w.outbox.pending for w in list(pool.workers.values()))

    def _run(self):
        # Ctrl-C is the main thread's (Python runs handlers there): let the
        # kernel deliver SIGINT to a thread that can take it at once.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        pool = self._pool
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        watched = {}             # registered object -> events
        try:
            while not self._stop.is_set():
                if self._may_rest():
                    # want() sets the flag and releases the lock: clear,
                    # then look again, so that no wake-up is lost.  Every
                    # POLL_S it looks at the sockets all the same, so that
                    # a death is noticed within seconds.
                    self._wanted = False
                    self._on_signal = True
                    woken = self._may_rest() and \
                        self._signal.acquire(timeout=POLL_S)
                    self._on_signal = False
                    if woken:
                        continue
                if pool.posted:
                    pool.submit_posted(keep_errors=True)
                self._watch(selector, watched)
                # Woken while on its way to the pipe: a look, no wait.
                ready = selector.select(
                    0 if self._signal.acquire(blocking=False) else POLL_S)
                if self._stop.is_set():
                    return
                exited = []
                for key, events in ready:
                    what = key.data
                    if what is None:
                        self._drain_wake_ups()
                    elif what == 'launcher':
                        exited.append(key.fileobj)
                    else:
                        if events & selectors.EVENT_WRITE:
                            what.outbox.flush()
                        if events & selectors.EVENT_READ:
                            self._read(what)
                if exited or self._check:
                    self._check = False
                    with pool.lock:
                        for launched in pool.launcher.exits(exited):
                            pool.on_exit(launched)
                        pool.replenish()
        except BaseException as e:   # a bug here must not hang next()
            if pool.closed:
                raise
            # next() raises it, with this traceback: the thread ends
            # without printing it ("Exception in thread") as well.
            error = ChainiterError(
                'the receiver thread of MultiprocessIterator failed: '
                '{!r}'.format(e))
            error.__cause__ = e
            pool.ready.put(error)
        finally:
            selector.close()

    def _drain_wake_ups(self):
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _watch(self, selector, watched):
        """Bring the selector up to date with the workers and launcher
        (only when they changed: it runs once per wake-up)."""
        if not self._dirty and not self._writing:
            return
        self._dirty = False
        pool = self._pool
        wanted = {obj: (selectors.EVENT_READ, 'launcher')
                  for obj in pool.launcher.watched()}
        for worker in list(pool.workers.values()):
            events = 0 if worker.at_eof else selectors.EVENT_READ
            if worker.outbox.pending:
                events |= selectors.EVENT_WRITE
            if events:
                wanted[worker.conn] = (events, worker)
        for obj in list(watched):
            if obj not in wanted:
                selector.unregister(obj)
                del watched[obj]
        while pool.gone:         # unregistered: now their sockets may go
            pool.gone.pop().close()
        for obj, (events, data) in wanted.items():
            if obj not in watched:
                selector.register(obj, events, data)
            elif watched[obj] != events:
                selector.modify(obj, events, data)
            watched[obj] = events
        self._writing = any(events & selectors.EVENT_WRITE
                            for events in watched.values())

    def _read(self, worker):
        """Read the results waiting in the worker's socket."""
        try:
            messages = _loaded(receive_results(worker.conn))
        except (EOFError, OSError):
            worker.at_eof = True   # it has exited; the launcher tells
            self._dirty = True
            return
        with self._pool.lock:
            self._deliver(worker, messages)

    def drain(self, worker):
        """Every result still in the socket of a worker that has exited
        (under the pool's lock)."""
        try:
            while worker.conn.poll():
                self._deliver(worker, _loaded(receive_results(worker.conn)))
        except (EOFError, OSError):
            pass

    def _deliver(self, worker, messages):
        """Hand the pool the messages ``_loaded`` unpickled (under the
        pool's lock)."""
        pool = self._pool
        for generation, seq, chunk, value in messages:
            if seq == STARTED:
                worker.started = True
            elif seq == STARTUP_FAILED:
                pool.on_startup_failure(worker, value)
            elif seq == NO_ROOM:
                pool.on_no_room(*value)
            else:
                pool.on_result(worker, generation, seq, chunk, value)


def _loaded(messages):
    """The messages with their payloads unpickled, before the pool's lock
    is taken (``wire.load_result``)."""
    out = []
    for generation, seq, chunk, payload in messages:
        if seq == STARTUP_FAILED:
            value = remote.startup_error(payload)
        elif seq == NO_ROOM:
            value = pickle.loads(payload)
        elif seq == STARTED:
            value = None
        else:
            value = load_result(payload)
        out.append((generation, seq, chunk, value))
    return out
