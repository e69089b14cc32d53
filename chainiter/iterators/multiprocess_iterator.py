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
    send_frame,
    worker_main,
)

_JOIN_TIMEOUT_S = 1.0         # then terminate, then kill
_RECEIVER_POLL_S = 1.0        # receiver thread wakes up at least this often
_MAX_DEATHS_PER_BATCH = 3
_GROWTH = 1.25                # buffers grow at least by this factor
# The receiver thread rests while this many batches wait for the consumer,
# until fewer than _READY_LOW do: results then pile up in the pipes and one
# wake-up reads several, instead of one wake-up per result.  It is woken
# before a task is sent that might not fit in the worker's socket buffer:
# the worker may be blocked writing a result only the receiver reads.
_READY_HIGH = 4
_READY_LOW = 2


# Put in the ready queue to have next() make the sends the receiver thread
# deferred to it.
_SEND_DEFERRED = object()
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
        for worker in list(pool._workers):
            children.discard(worker.process)


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_forget_workers_in_child)


def _send_cost(task):
    """More than the bytes a task takes in a socket buffer: the kernel
    counts about twice the payload, plus a fixed overhead per message."""
    return 16 * len(task.indices) + 1024


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
    __slots__ = ('busy', 'exporter', 'index', 'owner', 'shared')

    def __init__(self, index):
        self.index = index
        self.shared = None     # its SharedBuffer, once it is first needed
        self.busy = 0          # chunks that may still write into it
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
    def __init__(self, worker_id, process, conn):
        self.id = worker_id
        self.process = process
        self.conn = conn
        self.sentinel = process.sentinel
        self.send_lock = threading.Lock()
        self.outstanding = {}  # (seq, chunk) -> Task
        self.sent = 0
        self.queued = 0        # _send_cost of the outstanding tasks
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            # Tasks up to this much never block a send (see _READY_HIGH).
            self.room = sock.getsockopt(socket.SOL_SOCKET,
                                        socket.SO_SNDBUF) // 2

    def send(self, message):
        """Send, ignoring a worker that has just died: its sentinel tells
        the receiver thread, which gives its tasks to a new worker."""
        self._send(self.conn.send, message)

    def send_bytes(self, data):
        self._send(functools.partial(send_frame, self.conn), data)

    def send_slot(self, buffer_id, slot):
        """Hand a slot's memory to the worker: a message, then the file
        descriptor itself over the same socket."""
        def send(message):
            self.conn.send(message)
            reduction.send_handle(self.conn, slot.shared.fd,
                                  self.process.pid)
        self._send(send, ('slot', buffer_id, slot.index, slot.shared.size))

    def _send(self, send, message):
        try:
            with self.send_lock:
                if not self.conn.closed:
                    send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            pass   # the worker is dead or dying

    def close(self):
        """Close the pipe; under the send lock, so that a send made by
        another thread never writes to a closed (or reused) descriptor."""
        with self.send_lock:
            self.conn.close()


class _Pool:
    """The worker processes, the buffers and the receiver thread.

    It holds no reference to the iterator, so that garbage collection of the
    iterator finalizes the pool.
    """

    def __init__(self, ctx, dataset, n_workers, seed, worker_init_fn,
                 max_tasks, n_prefetch, layout=None):
        self.owner = os.getpid()   # only this process may use or close it
        _POOLS.add(self)
        self._ctx = ctx
        self._dataset = dataset
        self._n_workers = n_workers
        self._seed = seed
        self._worker_init_fn = worker_init_fn
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
        self._next_worker_id = 0
        self._buffers = None
        self._events = []        # warnings to raise in the main thread
        # Sends that next() makes outside the lock (see submit).
        self._deferred = []
        self._closed = False
        # A worker that could not start (worker_init_fn raised, the dataset
        # could not be unpickled): every batch fails with it from then on.
        self._startup_error = None
        self._stop = threading.Event()
        self._wanted = threading.Event()
        self._wanted.set()
        self._wake_r, self._wake_w = multiprocessing.connection.Pipe(
            duplex=False)
        if layout is not None:      # before any worker starts
            self.use_layout(layout)
        for _ in range(n_workers):
            self._start_worker()
        self._thread = threading.Thread(
            target=self._receive_loop, name='chainiter-receiver', daemon=True)
        self._thread.start()

    # ---- workers ---------------------------------------------------------

    def _start_worker(self):
        parent_conn, child_conn = self._ctx.Pipe()
        worker_id = self._next_worker_id % self._n_workers
        self._next_worker_id += 1
        dataset = self._dataset
        if self._ctx.get_start_method() != 'fork':
            dataset = PickledDataset(dataset)
        process = self._ctx.Process(
            target=worker_main, name='chainiter-worker-{}'.format(worker_id),
            args=(child_conn, dataset, self._seed, worker_id,
                  self._n_workers, self._worker_init_fn, os.getpid(),
                  self._max_tasks,
                  threading.current_thread() is threading.main_thread()),
            daemon=True)
        process.start()
        child_conn.close()
        worker = _Worker(worker_id, process, parent_conn)
        buffers = self._buffers
        if buffers is not None:
            worker.send(('layout', buffers.id, buffers.layout))
            for slot in buffers.allocated():
                worker.send_slot(buffers.id, slot)
        self._workers.append(worker)
        self._wake_receiver()      # so that it watches the new worker
        return worker

    def _wake_receiver(self):
        try:
            self._wake_w.send_bytes(b'w')
        except OSError:
            pass

    def _accepting(self):
        return [w for w in self._workers
                if self._max_tasks is None or w.sent < self._max_tasks]

    def _assign(self, task):
        """Give ``task`` to the least busy worker; return the send that
        hands it over (the caller may make it after releasing the lock)."""
        workers = self._accepting()
        while len(workers) < self._n_workers:
            workers.append(self._start_worker())
        worker = min(workers, key=lambda w: len(w.outstanding))
        worker.outstanding[(task.seq, task.chunk)] = task
        worker.sent += 1
        worker.queued += _send_cost(task)
        return functools.partial(worker.send_bytes, encode_task(task))

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
            if self._startup_error is not None:
                self._fail(batch)
                return generation, seq
            if slot is not None:
                slot.busy += n_chunks
                slot.owner = (generation, seq)
            slot_index = -1 if slot is None else slot.index
            buffer_id = -1 if buffers is None else buffers.id
            if n_chunks == 1:
                sends = [self._assign(Task(
                    generation, seq, 0, 0, step.indices, step.spans,
                    slot_index, buffer_id, seed))]
            else:
                bounds = [n * k // n_chunks for k in range(n_chunks + 1)]
                sends = [self._assign(Task(
                    generation, seq, chunk, a, step.indices[a:b],
                    _state.cut_spans(step.spans, a, b), slot_index,
                    buffer_id, seed))
                    for chunk, (a, b) in enumerate(zip(bounds[:-1],
                                                       bounds[1:]))]
            blocking = self._send_may_block()
            if self._deferred:   # new slots first, then the tasks
                sends = self._deferred + sends
                self._deferred = []
        if blocking and not self._wanted.is_set():
            self._wanted.set()
        # Outside the lock: a send may wait for a worker that waits for the
        # receiver thread to read its results, and that thread needs the
        # lock.  A worker that died meanwhile has its tasks given to a new
        # worker by the receiver thread; this send is lost.
        for send in sends:
            send()
        return generation, seq

    def _free_slot(self):
        buffers = self._buffers
        if buffers is None:
            return None, None
        slots = buffers.slots
        for k in range(buffers.next, buffers.next + len(slots)):
            slot = slots[k % len(slots)]
            if slot.shared is not None and slot.busy == 0 and (
                    slot.owner is None or slot.owner[0] != self._generation) \
                    and (slot.exporter is None or slot.exporter() is None):
                buffers.next = slot.index + 1
                return slot, buffers
        for slot in buffers.slots:
            if slot.shared is None and not buffers.cannot_allocate:
                try:
                    self._allocate(buffers, slot)
                except MemoryError as e:
                    buffers.cannot_allocate = True
                    self._events.append((SharedMemoryWarning, (
                        'no room for one more shared-memory slot, so '
                        'batches that find no free slot come by copy: '
                        '{}'.format(e))))
                    return None, None
                return slot, buffers
        return None, None

    def _allocate(self, buffers, slot):
        slot.shared = SharedBuffer.allocate(buffers.layout.slot_bytes)
        for worker in self._workers:   # sent by submit, before the task
            self._deferred.append(functools.partial(
                worker.send_slot, buffers.id, slot))

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
            if batch is _SEND_DEFERRED:
                self._send_deferred()
                continue
            if isinstance(batch, BaseException):
                raise batch
            if batch.generation == generation and batch.seq == seq:
                self._raise_events()
                return batch

    def _send_deferred(self):
        with self._lock:
            sends, self._deferred = self._deferred, []
        for send in sends:
            send()

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
            self._generation += 1
            self._inflight.clear()
            self._reorderer.reset(self._next_seq)

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
                self._deferred.append(functools.partial(
                    worker.send, ('layout', new.id, layout)))
                self._deferred.append(functools.partial(
                    worker.send_slot, new.id, new.slots[0]))
            if old is not None:
                old.close()
        self._send_deferred()

    @property
    def layout(self):
        buffers = self._buffers
        return None if buffers is None else buffers.layout

    # ---- the receiver thread ------------------------------------------------

    def _receive_loop(self):
        """Wait on every worker's pipe, every worker's sentinel and the
        wake-up pipe at once, with one selector kept across iterations;
        rest while enough batches wait for the consumer (a death is then
        noticed once the consumer needs more, or within _RECEIVER_POLL_S)."""
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        watched = {}
        try:
            while not self._stop.is_set():
                if self._may_rest():
                    # next() sets the event when the queue runs short or
                    # a send might block: clear, then look again, so that
                    # no such wake-up is lost.  Every _RECEIVER_POLL_S it
                    # looks at the pipes and sentinels once all the same,
                    # so that a death is noticed within seconds.
                    self._wanted.clear()
                    if self._may_rest() and \
                            self._wanted.wait(_RECEIVER_POLL_S):
                        continue
                workers = self._workers
                if set(watched) != set(workers):
                    for worker in set(watched) - set(workers):
                        for obj in watched.pop(worker):
                            selector.unregister(obj)
                        worker.close()
                    for worker in set(workers) - set(watched):
                        selector.register(worker.conn, selectors.EVENT_READ,
                                          (worker, False))
                        selector.register(worker.sentinel,
                                          selectors.EVENT_READ,
                                          (worker, True))
                        watched[worker] = (worker.conn, worker.sentinel)
                ready = [key.data for key, _ in
                         selector.select(_RECEIVER_POLL_S)]
                if self._stop.is_set():
                    return
                for data in ready:
                    if data is not None and not data[1]:
                        self._receive(data[0])
                for data in ready:
                    if data is not None and data[1]:
                        self._worker_exited(data[0])
                if None in ready:
                    while self._wake_r.poll():
                        self._wake_r.recv_bytes()
        except BaseException as e:   # a bug here must not hang next()
            if not self._closed:
                self._ready.put(ChainiterError(
                    'the receiver thread of MultiprocessIterator failed: '
                    '{!r}'.format(e)))
            raise
        finally:
            selector.close()

    def _send_may_block(self):
        return any(w.queued > w.room for w in self._workers)

    def _may_rest(self):
        return self._ready.qsize() >= _READY_HIGH and \
            not self._send_may_block()

    def _receive(self, worker):
        """Read the results waiting in the worker's pipe."""
        try:
            messages = receive_results(worker.conn)
        except (EOFError, OSError):
            return   # the worker died; its sentinel tells
        with self._lock:
            for message in messages:
                self._on_result(worker, message)

    def _on_result(self, worker, message):
        generation, seq, chunk, _, payload = message
        if seq == STARTUP_FAILED:
            self._on_startup_failure(worker, payload)
            return
        task = worker.outstanding.pop((seq, chunk), None)
        if task is None:
            return
        worker.queued -= _send_cost(task)
        self._release_chunk(task)
        if generation != self._generation:
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
        if self._startup_error is None:
            _, remote = pickle.loads(payload)
            cause = remote.exception
            if cause is None:
                cause = ChainiterError('{}: {}'.format(remote.type_name,
                                                       remote.message))
            cause.__cause__ = RemoteTraceback(remote.traceback)
            self._startup_error = (
                'worker process {} could not start: {}. No more workers are '
                'started; fix the cause and build a new iterator'.format(
                    worker.id, remote.message), cause)
        for batch in list(self._inflight.values()):
            if batch.generation == self._generation:
                self._fail(batch)

    def _fail(self, batch):
        message, cause = self._startup_error
        batch.failure = ChainiterError(message)
        batch.failure.__cause__ = cause
        batch.results = {}
        self._complete(batch)

    def _release_chunk(self, task):
        """The chunk no longer writes into its slot.  (Slots of replaced
        buffers are never used again, so only the current ones count.)"""
        buffers = self._buffers
        if task.slot >= 0 and buffers is not None and \
                buffers.id == task.buffer_id:
            buffers.slots[task.slot].busy -= 1

    def _complete(self, batch):
        del self._inflight[batch.seq]
        for ready in self._reorderer.push(batch.seq, batch):
            self._ready.put(ready)

    def _worker_exited(self, worker):
        with self._lock:
            if worker not in self._workers:
                return
            # Results it sent before exiting are still in the pipe.
            try:
                while worker.conn.poll():
                    for message in receive_results(worker.conn):
                        self._on_result(worker, message)
            except (EOFError, OSError):
                pass
            self._workers.remove(worker)   # the receive loop closes conn
            worker.process.join()
            if self._startup_error is not None:
                return          # no replacement: it would fail the same way
            lost = list(worker.outstanding.values())
            retired = self._max_tasks is not None and \
                worker.sent >= self._max_tasks
            if not lost and (retired or worker.process.exitcode == 0):
                return          # retired after maxtasksperchild
            if self._closed:
                return
            # None when another thread's waitpid (multiprocessing reaps
            # every child when a process starts) took the status first.
            code = worker.process.exitcode
            how = 'an unknown exit status' if code is None else \
                'exit code {}'.format(code) if code >= 0 else \
                'signal {}'.format(-code)
            if code == -9:
                how += ' (SIGKILL: probably killed by the OOM killer)'
            self._events.append((WorkerRestartWarning, (
                'worker process {} (pid {}) died with {}; a new worker '
                'takes over and {} unfinished chunk(s) are loaded '
                'again'.format(worker.id, worker.process.pid, how,
                               len(lost)))))
            for task in lost:
                self._release_chunk(task)
            current = [task for task in lost
                       if task.generation == self._generation
                       and task.seq in self._inflight]
            for seq in sorted({task.seq for task in current}):
                batch = self._inflight[seq]
                batch.deaths += 1
                if batch.deaths >= _MAX_DEATHS_PER_BATCH:
                    batch.failure = WorkerDiedError(
                        'worker processes died {} times while loading the '
                        'batch of dataset indices {}; the last one (pid {}) '
                        'died with {}. The iterator stays at this '
                        'batch'.format(batch.deaths,
                                       _short_list(batch.step.indices),
                                       worker.process.pid, how))
                    batch.results = {}
                    self._complete(batch)
            for task in current:
                batch = self._inflight.get(task.seq)
                if batch is None:
                    continue      # failed above
                if task.slot >= 0 and batch.slot is not None:
                    batch.slot.busy += 1
                # Sent by next(): this thread must never wait on a worker
                # that may itself wait for this thread to read its results.
                self._deferred.append(self._assign(task))
            if self._deferred:
                self._ready.put(_SEND_DEFERRED)
            while len(self._accepting()) < self._n_workers:
                self._start_worker()

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
        workers = list(self._workers)
        for worker in workers:
            try:
                # Without waiting: a worker whose socket is full (it may be
                # blocked writing a result no one reads now) is terminated
                # below instead.
                os.set_blocking(worker.conn.fileno(), False)
                worker.send(None)   # exit after the task at hand
            except OSError:
                pass
            worker.close()
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
        for worker in workers:
            if worker.process.is_alive():
                worker.process.terminate()
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
        self._workers = []
        self._wake_r.close()
        self._wake_w.close()
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
