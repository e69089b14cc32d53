"""MultiprocessIterator: examples loaded by worker processes into shared memory.

::

    main thread (next)                    receiver thread           workers
    ──────────────────                    ───────────────           ───────
    advance(state) ─► Step ─► split into chunks ─► Task ────pipe────► dataset[i]
                                                                     write arrays
                                                                     into the slot
    wait on ready ◄── Reorderer ◄── Result (metadata) ◄────pipe──────┘
    views of the slot ─► user            ▲
                                         └── Process.sentinel: a dead worker's
                                             chunks go to its replacement

Each batch in flight owns a slot (a shared buffer of its own, allocated when
a batch first needs one, at most ``n_prefetch + 2``); a slot is reused only
when its chunks are done and no array handed to the user still views it
(every hand-out exports the slot through one ctypes object, and a weak
reference to it tells when the last view is gone).  When no slot is free, the
batch travels through the pipe instead.  The first batch always does: it
measures the sizes, then the layout is sent to the running workers and each
slot's file descriptor follows over the worker's own socket.  Every task
carries a generation number; ``reset()``, loading a snapshot and an
exception bump it, and results of older generations are dropped.

The receiver thread rests while several finished batches wait for the
consumer (results pile up in the pipes and one wake-up reads them all),
unless a task that ``next()`` sends might not fit in a worker's socket
buffer: that worker may be blocked writing a result only the receiver reads.
"""

import ctypes
import errno
import functools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import selectors
import socket
import threading
import time
import traceback
import warnings
import weakref
from multiprocessing import reduction

import numpy

from chainiter.dataset.convert import concat_examples
from chainiter.errors import (
    ChainiterError,
    IteratorFinalizedError,
    SharedMemoryWarning,
    TimeoutWarning,
    WorkerDiedError,
    WorkerRestartWarning,
)
from chainiter.iterators import _layout, _state
from chainiter.iterators._base import DatasetIterator
from chainiter.iterators._reorder import Reorderer
from chainiter.iterators._shm import SharedBuffer
from chainiter.iterators._worker import (
    STARTUP_FAILED,
    PickledDataset,
    RemoteError,
    RemoteTraceback,
    Result,
    Task,
    encode_task,
    receive_results,
)
from chainiter.iterators._launch import ForkLauncher, ProcessLauncher
from chainiter.iterators._outbox import Outbox

_JOIN_TIMEOUT_S = 1.0         # then terminate, then kill
_RECEIVER_POLL_S = 1.0        # receiver thread wakes up at least this often
_MAX_DEATHS_PER_BATCH = 3
_GROWTH = 1.25                # buffers grow at least by this factor
# The receiver thread rests while this many batches wait for the consumer,
# until fewer than _READY_LOW do: results then pile up in the pipes and one
# wake-up reads several, instead of one wake-up per result.  It never rests
# while a message waits in an outbox.
_READY_HIGH = 4
_READY_LOW = 2

# Put in the ready queue by close(): wakes a next() waiting in another thread.
_CLOSED = object()


# Every pool of this process, so that a forked child can let go of them.
_POOLS = weakref.WeakSet()


def _forget_workers_in_child():
    """After os.fork(): the workers are the parent's.  Take them off
    multiprocessing's list of this process's children, or its exit handler
    would terminate (daemonic) or try to join them in the child."""
    children = getattr(multiprocessing.process, '_children', None)
    if children is None:
        return
    for pool in list(_POOLS):
        for process in pool._launcher.processes():
            children.discard(process)


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_forget_workers_in_child)


def _stacking_padding(converter):
    """``(True, padding)`` when ``converter`` is ``concat_examples`` or a
    ``functools.partial`` of it with only ``padding``; else ``(False, None)``."""
    if converter is concat_examples:
        return True, None
    if isinstance(converter, functools.partial) and \
            converter.func is concat_examples and not converter.args and \
            set(converter.keywords) <= {'padding'}:
        return True, converter.keywords.get('padding')
    return False, None


class _Slot:
    __slots__ = ('exporter', 'index', 'owner', 'shared')

    def __init__(self, index):
        self.index = index
        self.shared = None     # its SharedBuffer, once it is first needed
        self.owner = None      # (generation, seq) of the batch it is for
        self.exporter = None   # weak reference to the hand-out's exporter


class _Buffers:
    """The slots of one layout.  A slot's memory is allocated when a batch
    first needs it, so memory follows what the loop really holds."""

    def __init__(self, buffer_id, layout, n_slots):
        self.id = buffer_id
        self.layout = layout
        self.slots = [_Slot(i) for i in range(n_slots)]
        self.cannot_allocate = False
        self.next = 0    # slots are freed about in turn: look here first

    def allocated(self):
        return [slot for slot in self.slots if slot.shared is not None]

    def close(self):
        """Replaced by new buffers: batches in flight may still be handed
        out from these slots, so the mappings stay."""
        for slot in self.allocated():
            slot.shared.close()

    def release(self):
        """The pool is closed: unmap the slots now."""
        for slot in self.allocated():
            slot.shared.release()


class _Batch:
    def __init__(self, generation, seq, step, n_chunks, slot, buffers):
        self.generation = generation
        self.seq = seq
        self.step = step
        self.n_chunks = n_chunks
        self.slot = slot
        self.buffers = buffers
        self.results = {}
        self.deaths = 0
        self.failure = None    # an exception to raise instead of the batch


class _Worker:
    """A worker process as the pool sees it."""

    def __init__(self, worker_id, launched):
        self.id = worker_id
        self.launched = launched
        self.conn = launched.conn
        self.outbox = Outbox(launched.conn)
        self.outstanding = {}  # (seq, chunk) -> Task, in the order sent
        self.sent = 0
        self.retired = False   # takes no more tasks; its exit is expected
        self.at_eof = False    # its end of the socket is closed

    def send_slot(self, buffer_id, slot):
        """Hand a slot's memory to the worker: a message, then the file
        descriptor itself over the same socket."""
        self.outbox.put_object(('slot', buffer_id, slot.index,
                                slot.shared.size))
        self.outbox.put_fd(slot.shared.fd)

    def retire(self):
        self.retired = True
        self.outbox.shut()

    def close(self):
        self.outbox.close()
        self.conn.close()


class _Pool:
    """The worker processes, the buffers and the receiver thread.

    It holds no reference to the iterator, so that garbage collection of the
    iterator finalizes the pool.
    """

    def __init__(self, ctx, dataset, n_workers, seed, worker_init_fn,
                 max_tasks, n_prefetch, layout=None):
        self.owner = os.getpid()   # only this process may use or close it
        self._n_workers = n_workers
        self._max_tasks = max_tasks
        self._n_prefetch = n_prefetch
        # In flight, the one the user holds, and one being handed out.
        self._n_slots = n_prefetch + 2
        self._lock = threading.Lock()
        self._ready = queue.SimpleQueue()   # C-level: far cheaper than Queue
        self._reorderer = Reorderer()
        self._generation = 0
        self._next_seq = 0
        self._inflight = {}
        self._workers = []
        self._gone = []
        self._unassigned = []    # tasks that wait for a worker to start
        self._next_worker_id = 0
        self._buffers = None
        self._events = []        # warnings to raise in the main thread
        self._closed = False
        # (message, cause) once no worker can start (worker_init_fn raised,
        # the dataset could not be unpickled, the launcher died): every
        # batch fails with it from then on.
        self._failure = None
        # The worker whose messages are being changed: when an exception
        # (a KeyboardInterrupt) interrupts that, its stream may be cut in
        # the middle of a message, or its tasks be known wrongly.
        self._touched = None
        self._stop = threading.Event()
        self._wanted = threading.Event()
        self._wanted.set()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        if ctx.get_start_method() == 'fork':
            # Forked now, while this pool has no thread of its own.
            self._launcher = ForkLauncher(ctx, (
                dataset, seed, n_workers, worker_init_fn, max_tasks))
        else:
            self._launcher = ProcessLauncher(ctx, (
                PickledDataset(dataset), seed, n_workers, worker_init_fn,
                max_tasks))
        _POOLS.add(self)
        if layout is not None:      # before any worker starts
            self.use_layout(layout)
        for _ in range(n_workers):
            self._start_worker()
        self._thread = threading.Thread(
            target=self._receive_loop, name='chainiter-receiver', daemon=True)
        self._thread.start()

    # ---- workers ---------------------------------------------------------

    def _start_worker(self):
        worker_id = self._next_worker_id % self._n_workers
        self._next_worker_id += 1
        worker = _Worker(worker_id, self._launcher.start(worker_id))
        buffers = self._buffers
        if buffers is not None:
            worker.outbox.put_object(('layout', buffers.id, buffers.layout))
            for slot in buffers.allocated():
                worker.send_slot(buffers.id, slot)
        self._workers.append(worker)
        self._wake_receiver()      # so that it watches the new worker
        return worker

    def _wake_receiver(self):
        try:
            os.write(self._wake_w, b'w')
        except OSError:
            pass       # full: a wake-up is waiting already

    def _flushed(self):
        """Wake the receiver thread when a message waits in an outbox."""
        if any(worker.outbox.pending for worker in self._workers):
            self._wanted.set()
            self._wake_receiver()

    def _replenish(self):
        """Start workers until enough take tasks; give them the tasks that
        waited for one (receiver thread, under the lock)."""
        if self._failure is not None or self._closed:
            return
        while len(self._accepting()) < self._n_workers:
            self._start_worker()
        tasks, self._unassigned = self._unassigned, []
        for task in tasks:
            if task.generation == self._generation:
                self._assign(task)

    def _accepting(self):
        return [w for w in self._workers if not w.retired and (
            self._max_tasks is None or w.sent < self._max_tasks)]

    def _assign(self, task):
        """Give ``task`` to the least busy worker (sent at once, or left in
        its outbox for the receiver thread).  Workers are started only by
        the receiver thread (an interrupt may land in the main thread): a
        task that finds no worker waits for it."""
        workers = self._accepting()
        if len(workers) < self._n_workers:
            self._wanted.set()
            self._wake_receiver()
        if not workers:
            self._unassigned.append(task)
            return
        worker = min(workers, key=lambda w: len(w.outstanding))
        # Recorded before it is sent: a task that may have been sent is
        # one whose slot is busy.
        self._touched = worker
        worker.outstanding[(task.seq, task.chunk)] = task
        worker.sent += 1
        worker.outbox.put(encode_task(task))
        self._touched = None

    def _send_slot(self, worker, buffer_id, slot, layout=None):
        self._touched = worker
        if layout is not None:
            worker.outbox.put_object(('layout', buffer_id, layout))
        worker.send_slot(buffer_id, slot)
        self._touched = None

    # ---- the main thread's side -------------------------------------------

    def submit(self, step, seed):
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            slot, buffers = self._free_slot()
            n = len(step.indices)
            # Every message costs, tiny examples too: split a batch only as
            # much as needed to keep every worker busy with the batches in
            # flight.
            n_chunks = min(n, -(-self._n_workers // self._n_prefetch))
            generation = self._generation
            batch = _Batch(generation, seq, step, n_chunks, slot, buffers)
            self._inflight[seq] = batch
            if self._failure is not None:
                self._fail(batch)
            else:
                if slot is not None:
                    slot.owner = (generation, seq)
                slot_index = -1 if slot is None else slot.index
                buffer_id = -1 if buffers is None else buffers.id
                bounds = [n * k // n_chunks for k in range(n_chunks + 1)]
                for chunk, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
                    self._assign(Task(
                        generation, seq, chunk, a,
                        step.indices if n_chunks == 1 else step.indices[a:b],
                        step.spans if n_chunks == 1 else
                        _state.cut_spans(step.spans, a, b),
                        slot_index, buffer_id, seed))
                self._flushed()
        return generation, seq

    def _busy_slots(self, buffers):
        """Slots that a task sent to a worker may still write into."""
        return {task.slot for worker in self._workers
                for task in worker.outstanding.values()
                if task.buffer_id == buffers.id}

    def _free_slot(self):
        buffers = self._buffers
        if buffers is None:
            return None, None
        slots = buffers.slots
        busy = None
        for k in range(buffers.next, buffers.next + len(slots)):
            slot = slots[k % len(slots)]
            if slot.shared is not None and (
                    slot.owner is None or slot.owner[0] != self._generation) \
                    and (slot.exporter is None or slot.exporter() is None):
                if busy is None:
                    busy = self._busy_slots(buffers)
                if slot.index in busy:
                    continue
                buffers.next = slot.index + 1
                return slot, buffers
        for slot in buffers.slots:
            if slot.shared is None and not buffers.cannot_allocate:
                try:
                    slot.shared = SharedBuffer.allocate(
                        buffers.layout.slot_bytes)
                except (MemoryError, OSError) as e:
                    if isinstance(e, OSError) and e.errno not in (
                            errno.EMFILE, errno.ENFILE, errno.ENOMEM,
                            errno.ENOSPC):
                        raise
                    buffers.cannot_allocate = True
                    self._events.append((SharedMemoryWarning, (
                        'no room for one more shared-memory slot ({} of '
                        'the {} that n_prefetch={} may use are in use), so '
                        'batches that find no free slot come by copy, which '
                        'is slower; lower n_prefetch or raise the limit: '
                        '{}'.format(len(buffers.allocated()), self._n_slots,
                                    self._n_prefetch, e))))
                    return None, None
                for worker in self._workers:   # before the task
                    self._send_slot(worker, buffers.id, slot)
                return slot, buffers
        return None, None

    def wait(self, handle, timeout):
        """The finished ``_Batch`` of ``handle``; warns every ``timeout``
        seconds while waiting."""
        generation, seq = handle
        while True:
            self._raise_events()
            try:
                batch = self._ready.get(
                    timeout=timeout if timeout else _RECEIVER_POLL_S)
            except queue.Empty:
                if timeout:
                    warnings.warn(
                        'no batch arrived for {} seconds (dataset_timeout); '
                        'a dataset[i] may be stuck. The iterator goes on '
                        'waiting'.format(timeout), TimeoutWarning,
                        stacklevel=4)
                if self._closed:
                    raise IteratorFinalizedError(
                        'MultiprocessIterator was finalized while next() '
                        'waited for a batch')
                if not self._thread.is_alive():
                    raise ChainiterError(
                        'the receiver thread of MultiprocessIterator died'
                    ) from None
                continue
            if batch is _CLOSED or self._closed:
                self._ready.put(_CLOSED)    # for any other waiter
                raise IteratorFinalizedError(
                    'MultiprocessIterator was finalized while next() waited '
                    'for a batch')
            if not self._wanted.is_set() and \
                    self._ready.qsize() < _READY_LOW:
                self._wanted.set()
            if isinstance(batch, BaseException):
                raise batch
            if batch.generation == generation and batch.seq == seq:
                self._raise_events()
                return batch

    def _raise_events(self):
        if not self._events:
            return
        with self._lock:
            events, self._events = self._events, []
        for category, message in events:
            warnings.warn(message, category, stacklevel=5)

    def hand_out(self, batch):
        """Mark the batch's slot as viewed by the user; return the exporter
        that every array of the hand-out must view."""
        slot = batch.slot
        if slot is None:
            return None
        exporter = (ctypes.c_char * batch.buffers.layout.slot_bytes) \
            .from_buffer(slot.shared.buffer)
        with self._lock:
            slot.exporter = weakref.ref(exporter)
            slot.owner = None
        return exporter

    def new_generation(self):
        """Drop every batch in flight (their results are ignored)."""
        with self._lock:
            if self._touched is not None:
                # An exception interrupted a send: that worker finishes
                # what it has, then exits; a new one takes over.
                self._touched.retire()
                self._touched = None
            self._generation += 1
            self._inflight.clear()
            self._unassigned = []
            self._reorderer.reset(self._next_seq)
        self._wake_receiver()

    def use_layout(self, layout):
        """Switch to buffers for ``layout`` (its first slot is allocated at
        once, so that no room at all is a clear error now)."""
        with self._lock:
            old = self._buffers
            new = _Buffers(0 if old is None else old.id + 1, layout,
                           self._n_slots)
            new.slots[0].shared = SharedBuffer.allocate(layout.slot_bytes)
            self._buffers = new
            for worker in self._workers:
                self._send_slot(worker, new.id, new.slots[0], layout)
            if old is not None:
                old.close()
            self._flushed()

    @property
    def layout(self):
        buffers = self._buffers
        return None if buffers is None else buffers.layout

    # ---- the receiver thread ------------------------------------------------

    def _receive_loop(self):
        """Wait on every worker's socket (to read; to write too when its
        outbox holds messages), on the launcher and on the wake-up pipe, at
        once; rest while enough batches wait for the consumer (a death is
        then noticed once the consumer needs more, or within
        _RECEIVER_POLL_S)."""
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        watched = {}             # registered object -> events
        try:
            while not self._stop.is_set():
                if self._may_rest():
                    # next() sets the event when the queue runs short or
                    # a message waits: clear, then look again, so that no
                    # such wake-up is lost.  Every _RECEIVER_POLL_S it
                    # looks at the sockets once all the same, so that a
                    # death is noticed within seconds.
                    self._wanted.clear()
                    if self._may_rest() and \
                            self._wanted.wait(_RECEIVER_POLL_S):
                        continue
                self._watch(selector, watched)
                ready = selector.select(_RECEIVER_POLL_S)
                if self._stop.is_set():
                    return
                exited = []
                for key, events in ready:
                    what = key.data
                    if what is None:
                        try:
                            while os.read(self._wake_r, 4096):
                                pass
                        except BlockingIOError:
                            pass
                    elif what == 'launcher':
                        exited.append(key.fileobj)
                    else:
                        if events & selectors.EVENT_WRITE:
                            what.outbox.flush()
                        if events & selectors.EVENT_READ:
                            self._receive(what)
                with self._lock:
                    for launched in self._launcher.exits(exited):
                        self._worker_exited(launched)
                    if self._unassigned or \
                            len(self._accepting()) < self._n_workers:
                        self._replenish()
        except BaseException as e:   # a bug here must not hang next()
            if not self._closed:
                self._ready.put(ChainiterError(
                    'the receiver thread of MultiprocessIterator failed: '
                    '{!r}'.format(e)))
            raise
        finally:
            selector.close()

    def _watch(self, selector, watched):
        """Bring the selector up to date with the workers and launcher."""
        wanted = {obj: (selectors.EVENT_READ, 'launcher')
                  for obj in self._launcher.watched()}
        for worker in list(self._workers):
            events = 0 if worker.at_eof else selectors.EVENT_READ
            if worker.outbox.pending:
                events |= selectors.EVENT_WRITE
            if events:
                wanted[worker.conn] = (events, worker)
        for obj in list(watched):
            if obj not in wanted:
                selector.unregister(obj)
                del watched[obj]
        while self._gone:        # unregistered: now their sockets may go
            self._gone.pop().close()
        for obj, (events, data) in wanted.items():
            if obj not in watched:
                selector.register(obj, events, data)
            elif watched[obj] != events:
                selector.modify(obj, events, data)
            watched[obj] = events

    def _may_rest(self):
        return self._ready.qsize() >= _READY_HIGH and not self._unassigned \
            and not any(worker.outbox.pending for worker in self._workers)

    def _receive(self, worker):
        """Read the results waiting in the worker's socket."""
        try:
            messages = receive_results(worker.conn)
        except (EOFError, OSError):
            worker.at_eof = True   # it has exited; the launcher tells
            return
        with self._lock:
            for message in messages:
                self._on_result(worker, message)

    def _on_result(self, worker, message):
        generation, seq, chunk, _, payload = message
        if seq == STARTUP_FAILED:
            self._on_startup_failure(worker, payload)
            return
        task = worker.outstanding.pop((seq, chunk), None)
        if task is None or generation != self._generation:
            return
        batch = self._inflight.get(seq)
        if batch is None:
            return
        try:
            metas, error = pickle.loads(payload)
        except Exception as e:
            metas, error = [], RemoteError(
                None, type(e).__qualname__,
                'the examples of dataset indices {} came back from the '
                'worker but cannot be unpickled in the main process: {}: '
                '{}'.format(_short_list(task.indices), type(e).__qualname__,
                            e),
                traceback.format_exc(), int(task.indices[0]))
        batch.results[chunk] = Result(generation, seq, chunk, metas, error)
        if len(batch.results) == batch.n_chunks:
            self._complete(batch)

    def _on_startup_failure(self, worker, payload):
        """A worker could not start: start no more (they would fail the
        same way, forever), and fail every batch with the real cause."""
        if self._failure is None:
            _, remote = pickle.loads(payload)
            cause = remote.exception
            if cause is None:
                cause = ChainiterError('{}: {}'.format(remote.type_name,
                                                       remote.message))
            cause.__cause__ = RemoteTraceback(remote.traceback)
            self._fail_all(
                'worker process {} could not start: {}. No more workers are '
                'started; fix the cause and build a new iterator'.format(
                    worker.id, remote.message), cause)

    def _fail_all(self, message, cause):
        self._failure = (message, cause)
        for batch in list(self._inflight.values()):
            if batch.generation == self._generation:
                self._fail(batch)

    def _fail(self, batch):
        message, cause = self._failure
        batch.failure = ChainiterError(message)
        batch.failure.__cause__ = cause
        batch.results = {}
        self._complete(batch)

    def _complete(self, batch):
        del self._inflight[batch.seq]
        for ready in self._reorderer.push(batch.seq, batch):
            self._ready.put(ready)

    def _worker_exited(self, launched):
        worker = next((w for w in self._workers if w.launched is launched),
                      None)
        if worker is None:
            return
        # Results it sent before exiting are still in the socket.
        try:
            while worker.conn.poll():
                for message in receive_results(worker.conn):
                    self._on_result(worker, message)
        except (EOFError, OSError):
            pass
        self._workers.remove(worker)
        self._gone.append(worker)      # closed by _watch
        lost = list(worker.outstanding.values())
        expected = worker.retired or (self._max_tasks is not None and
                                      worker.sent >= self._max_tasks)
        if self._failure is not None or self._closed or \
                (not lost and (expected or launched.exitcode == 0)):
            return
        code = launched.exitcode
        how = 'an unknown exit status' if code is None else \
            'exit code {}'.format(code) if code >= 0 else \
            'signal {}'.format(-code)
        if code == -9:
            how += ' (SIGKILL: probably killed by the OOM killer)'
        current = [task for task in lost
                   if task.generation == self._generation
                   and task.seq in self._inflight]
        if not current and worker.retired:
            return                # nothing it had is still wanted
        self._events.append((WorkerRestartWarning, (
            'worker process {} (pid {}) died with {}; a new worker '
            'takes over and {} unfinished chunk(s) are loaded '
            'again'.format(worker.id, launched.pid, how, len(current)))))
        if not getattr(self._launcher, 'alive', True):
            self._fail_all(
                'the process that starts the worker processes (pid {}) '
                'died, and the workers with it; build a new iterator (a '
                'snapshot taken before resumes exactly)'.format(
                    self._launcher.process.pid), None)
            return
        if current:
            # Only the batch it was loading (the oldest task it had)
            # counts this death; the ones queued behind it are innocent.
            loading = self._inflight[current[0].seq]
            loading.deaths += 1
            if loading.deaths >= _MAX_DEATHS_PER_BATCH:
                loading.failure = WorkerDiedError(
                    'worker processes died {} times while loading the '
                    'batch of dataset indices {}; the last one (pid {}) '
                    'died with {}. The iterator stays at this '
                    'batch'.format(loading.deaths,
                                   _short_list(loading.step.indices),
                                   launched.pid, how))
                loading.results = {}
                self._complete(loading)
        self._replenish()
        for task in current:
            if task.seq in self._inflight:
                self._assign(task)

    # ---- shutdown ----------------------------------------------------------

    def close(self):
        if self._closed or os.getpid() != self.owner:
            # A forked child's copy: the workers and buffers are the
            # parent's, and its threads and locks are not usable here.
            return
        self._closed = True
        self._ready.put(_CLOSED)
        self._stop.set()
        self._wanted.set()
        self._wake_receiver()
        if threading.current_thread() is not self._thread:
            self._thread.join(_JOIN_TIMEOUT_S * 5)
        for worker in self._gone:
            worker.close()
        for worker in list(self._workers):
            # Without waiting: a worker whose socket is full (it may be
            # blocked writing a result no one reads now) is stopped by
            # the launcher instead.
            worker.outbox.put_object(None)   # exit after the task at hand
            worker.close()
        self._workers = []
        self._launcher.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        if self._buffers is not None:
            self._buffers.release()


def _short_list(indices, limit=10):
    indices = [int(i) for i in indices]
    if len(indices) <= limit:
        return str(indices)
    return '[{}, ... ({} in all)]'.format(
        ', '.join(map(str, indices[:limit])), len(indices))


def _check_picklable(obj, what, method):
    try:
        pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except RuntimeError:
        # Locks, events and queues of multiprocessing pickle only while a
        # process starts; they reach the workers then.
        pass
    except Exception as e:
        raise TypeError(
            'MultiprocessIterator with start method {!r} sends the {} to the '
            'worker processes by pickling, but it cannot be pickled ({}: '
            '{}). Define its class and the functions it uses at module '
            'level (not inside a function, not as a lambda), or use '
            'start_method="fork"'.format(method, what, type(e).__name__, e)
        ) from e


class MultiprocessIterator(DatasetIterator):
    """Loads examples in worker processes, through shared memory.

    Args:
        dataset, batch_size, repeat, shuffle, order_sampler, seed: as for
            ``SerialIterator``; the batches are the same.
        n_processes (int or None): worker processes (None: the CPUs this
            process may use).
        n_prefetch (int): batches in flight ahead of the one handed out;
            each holds a slot of shared memory.  Batches that load in well
            under a millisecond run much faster with more in flight (e.g.
            16 per worker: the processes then rarely wait on each other);
            large batches gain little from more than 2 per worker.
        shared_mem (int or None): bytes of shared memory per example (None:
            measured from the first batch).  Larger examples are still
            delivered, with a ``SharedMemoryWarning``, and the buffers grow.
            When the workers stack the batch, the shapes are measured from
            the first batch and ``shared_mem`` lengthens the padded fields
            so that each example has room for that many bytes.
        dataset_timeout (float or None): warn with ``TimeoutWarning`` when no
            batch arrived for that many seconds.
        maxtasksperchild (int or None): replace a worker after that many
            tasks.
        converter: applied to each batch.  With ``concat_examples`` (or a
            ``functools.partial`` of it with ``padding``) the workers stack the
            batch straight into shared memory and ``next()`` returns it.
        start_method (str or None): ``'fork'``, ``'forkserver'``, ``'spawn'``,
            or None for Python's default.
        worker_init_fn: called as ``worker_init_fn(worker_id)`` in each
            worker when it starts.

    Arrays handed out may view shared memory; they stay valid and unchanged
    for as long as they are referenced.
    """

    TimeoutWarning = TimeoutWarning

    def __init__(self, dataset, batch_size, repeat=True, shuffle=None,
                 n_processes=None, n_prefetch=1, shared_mem=None,
                 order_sampler=None, dataset_timeout=30.0,
                 maxtasksperchild=None, *, seed=None, converter=None,
                 start_method=None, worker_init_fn=None):
        self._pool = None
        if n_processes is None:
            n_processes = len(os.sched_getaffinity(0)) if hasattr(
                os, 'sched_getaffinity') else os.cpu_count() or 1
        for name, value, minimum in (('n_processes', n_processes, 1),
                                     ('n_prefetch', n_prefetch, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or \
                    value < minimum:
                raise ValueError(
                    '{} must be an int >= {}, got {!r}{}'.format(
                        name, minimum, value,
                        '; use SerialIterator to load in the main process'
                        if name == 'n_processes' else ''))
        if shared_mem is not None and (
                isinstance(shared_mem, bool)
                or not isinstance(shared_mem, int) or shared_mem <= 0):
            raise ValueError('shared_mem must be a positive int (bytes per '
                             'example) or None, got {!r}'.format(shared_mem))
        if maxtasksperchild is not None and (
                not isinstance(maxtasksperchild, int)
                or maxtasksperchild <= 0):
            raise ValueError('maxtasksperchild must be a positive int or '
                             'None, got {!r}'.format(maxtasksperchild))
        if dataset_timeout is not None and (
                isinstance(dataset_timeout, bool)
                or not isinstance(dataset_timeout, (int, float))
                or not 0 < dataset_timeout < float('inf')):
            raise ValueError(
                'dataset_timeout must be a positive number of seconds, or '
                'None for no TimeoutWarning; got {!r}'.format(dataset_timeout))
        if converter is not None and not callable(converter):
            raise TypeError('converter must be callable, got {!r}'.format(
                converter))
        super().__init__(dataset, batch_size, repeat, shuffle, order_sampler,
                         seed)
        self.n_processes = n_processes
        self.n_prefetch = n_prefetch
        self.shared_mem = shared_mem
        self.dataset_timeout = dataset_timeout
        self.maxtasksperchild = maxtasksperchild
        self.converter = converter
        self.worker_init_fn = worker_init_fn
        self._stacked, self._padding = _stacking_padding(converter)
        self._warned_size = False
        self._warned_mismatch = False
        self._cannot_grow = False

        ctx = multiprocessing.get_context(start_method)
        method = ctx.get_start_method()
        if method != 'fork':
            _check_picklable(dataset, 'dataset', method)
            if worker_init_fn is not None:
                _check_picklable(worker_init_fn, 'worker_init_fn', method)
        self.start_method = method
        self._prefetch_depth = n_prefetch
        self._start_transport()
        self._start_pool()
        # Until the first batch has sized the buffers, batches travel
        # through the pipe: send only that one, the rest follow it.
        self._dispatch_until(n_prefetch if self._pool.layout is not None
                             else 1)

    def _start_transport(self):
        # The workers start with the first batch (at once when built, at
        # the first next() when unpickled: unpickling may happen while a
        # spawned process starts, where no process may be started).
        self._pool = None
        self._finalizer = None
        self._cannot_grow = False

    def _start_pool(self):
        layout = None
        if self.shared_mem is not None and not self._stacked:
            layout = _layout.list_layout(self.batch_size, self.shared_mem)
        self._pool = _Pool(multiprocessing.get_context(self.start_method),
                           self.dataset, self.n_processes, self._seed,
                           self.worker_init_fn, self.maxtasksperchild,
                           self.n_prefetch, layout)
        self._finalizer = weakref.finalize(self, self._pool.close)

    def _transport_attributes(self):
        return super()._transport_attributes() + ('_pool', '_finalizer')

    # ---- transport ----------------------------------------------------------

    def __next__(self):
        self._leave_parents_pool()
        return super().__next__()

    def _leave_parents_pool(self):
        """In a forked child (os.fork(), or a fork Process given the
        iterator) the workers are the parent's: leave them alone, and load
        on from the current state with workers of its own."""
        pool = self._pool
        if pool is not None and pool.owner != os.getpid():
            self._finalizer.detach()
            self._start_transport()
            self._rewind()

    def _submit(self, step):
        if self._pool is None:
            self._start_pool()
        return self._pool.submit(step, self._pass_seed)

    def _drop_pending(self):
        if self._pool is not None:
            self._pool.new_generation()
        super()._drop_pending()

    def _collect(self, handle):
        pool = self._pool
        batch = pool.wait(handle, self.dataset_timeout)
        if batch.failure is not None:
            raise batch.failure
        results = [batch.results[i] for i in range(batch.n_chunks)]
        for result in results:
            if result.error is not None:
                raise _rebuild_error(result.error)
        chunks = [result.metas for result in results]
        exporter = pool.hand_out(batch)
        if exporter is None:     # the batch came through the pipe
            examples = [meta.example for chunk in chunks for meta in chunk]
            if pool.layout is None:
                self._fit_buffers(examples, None, ())
            return self._convert(examples)
        layout = batch.buffers.layout
        stacked, examples, oversize = _layout.read_batch(
            numpy.frombuffer(exporter, dtype=numpy.uint8), 0, layout, chunks)
        if stacked is not None:
            return stacked
        if oversize:
            self._fit_buffers(examples, layout, oversize)
        return self._convert(examples)

    def _convert(self, examples):
        if self.converter is not None:
            return self.converter(examples)
        return examples

    def _fit_buffers(self, examples, layout, oversize):
        """Size the buffers from a batch that did not (fully) go through
        them: the first batch, or one with an oversize example."""
        if self._cannot_grow:
            return
        if self._stacked:
            capacities = None
            if layout is not None and layout.mode == 'stacked':
                capacities = {f.key: tuple(int(numpy.ceil(c * _GROWTH))
                                           for c in f.capacity)
                              for f in layout.fields}
            new = _layout.stacked_layout(examples, self.batch_size,
                                         self._padding, capacities)
            if new is None and layout is not None:
                return   # the batch cannot be stacked; keep the layout
            if new is not None and layout is not None and \
                    layout.mode == 'stacked':
                how = _layout.mismatch(layout, new)
                if how is not None:
                    # Not a matter of room: switching layouts would only
                    # make the batches like the first one miss in turn.
                    self._warn_mismatch(how)
                    return
            if new is not None and layout is None and self.shared_mem:
                new = _layout.widen(new, examples, self.batch_size,
                                    self.shared_mem)
        else:
            new = None
        if new is None:
            needed = max(_layout.example_array_bytes(e) for e in examples)
            if needed == 0:
                return   # no arrays: nothing to put in shared memory
            if layout is not None and layout.mode == 'list':
                needed = max(needed, int(layout.example_bytes * _GROWTH))
            new = _layout.list_layout(self.batch_size, needed)
        if layout is not None and oversize and not self._warned_size:
            self._warned_size = True
            need = max(_layout.example_array_bytes(e) for e in oversize)
            warnings.warn(
                'an example with {} bytes of arrays did not fit its shared '
                'memory ({} bytes per example); it was delivered intact '
                'through a copy and the buffers were enlarged. Pass '
                'shared_mem={} (or more) to reserve enough from the '
                'start'.format(need, layout.slot_bytes // self.batch_size,
                               new.slot_bytes // self.batch_size),
                SharedMemoryWarning, stacklevel=4)
        if layout is None:
            self._pool.use_layout(new)   # no room at all: a clear error
            return
        try:
            self._pool.use_layout(new)
        except MemoryError as e:
            # The old buffers stay; larger examples keep coming by copy.
            self._cannot_grow = True
            warnings.warn('the shared-memory buffers could not be enlarged, '
                          'so larger examples keep coming by copy: {}'.format(
                              e), SharedMemoryWarning, stacklevel=4)

    def _warn_mismatch(self, how):
        if self._warned_mismatch:
            return
        self._warned_mismatch = True
        warnings.warn(
            'a batch did not match the layout measured from the first batch '
            '({}), so the main process stacked it from copies, which is '
            'slower; every such batch is. Give every example the same '
            'dtypes and shapes (e.g. make every label an int) to have the '
            'workers stack it in shared memory'.format(how),
            SharedMemoryWarning, stacklevel=5)

    def finalize(self):
        self._leave_parents_pool()     # nothing of the parent's to end
        super().finalize()
        if self._finalizer is not None:
            self._finalizer()


def _rebuild_error(remote):
    cause = RemoteTraceback(remote.traceback)
    if remote.exception is not None:
        error = remote.exception
    else:
        error = ChainiterError(
            '{}: {} (raised in a worker while loading dataset[{}]; the '
            'exception itself could not be pickled)'.format(
                remote.type_name, remote.message, remote.index))
    error.__cause__ = cause
    notes = getattr(error, '__notes__', [])
    if hasattr(error, 'add_note') and not any(
            'dataset[{}]'.format(remote.index) in n for n in notes):
        error.add_note('raised while loading dataset[{}] in a worker '
                       'process'.format(remote.index))
    return error
