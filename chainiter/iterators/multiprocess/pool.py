"""The pool: worker processes, their outboxes, the book, the slots and the
receiver thread, under one lock.

The main thread calls ``submit`` (a batch is cut into tasks, each recorded
in the book and put in a worker's outbox) or ``post`` (the receiver
thread submits it soon, between the main thread's ``next()`` calls),
``wait`` (the next batch, in order, from the ready queue) and
``hand_out``.  The receiver thread (``receiver.py``) reads results and
exits and writes what the outboxes hold.  Workers are started by the
launcher (``launch.py``): at construction, then only from the receiver
thread, so that an interrupt in the main thread never cuts a start
short.

Which thread writes and reads what, under which lock: the table under
"Threads" in ``__init__.py``.  Each method says which thread calls it;
"under the lock": its caller holds ``self.lock``.
"""

import collections
import os
import queue
import time
import threading
import warnings

import numpy

from chainiter._interrupts import uninterrupted
from chainiter.errors import (
    ChainiterError,
    IteratorFinalizedError,
    SharedMemoryWarning,
    TimeoutWarning,
    WorkerRestartWarning,
)
from chainiter.iterators.multiprocess import (
    forks, read, receiver, share, wire)
from chainiter.iterators.multiprocess.book import Batch, Book
from chainiter.iterators.multiprocess.launch import (
    ForkLauncher, ProcessLauncher)
from chainiter.iterators.multiprocess.remote import RemoteTraceback
from chainiter.iterators.multiprocess.worker_handle import Worker

# Put in the ready queue by close(): wakes a next() waiting in another thread.
_CLOSED = object()

# ``ready.get``'s first argument: block.
_BLOCK = (True,)


class Pool:
    """It holds no reference to the iterator, so that garbage collection of
    the iterator finalizes the pool."""

    def __init__(self, ctx, dataset, n_workers, seed, worker_init_fn,
                 max_tasks, n_prefetch, slots, split=True, cpus=None):
        self.owner = os.getpid()   # only this process may use or close it
        self.method = ctx.get_start_method()
        self.lock = threading.Lock()
        self.book = Book(n_workers, n_prefetch, max_tasks, split, cpus)
        # In flight, the one the user holds, and one being handed out.
        self.slots = slots
        self.ready = queue.SimpleQueue()   # C-level: far cheaper than Queue
        # What ``wait`` or ``take`` got from the ready queue and has not
        # handed out or dropped yet (one item at most).
        self._box = collections.deque()
        # True while ``wait`` blocks with nothing taken from the ready
        # queue: an exception raised there (a Ctrl-C) leaves every batch
        # in flight or ready where it was (``interrupted_waiting``).
        self.waiting = False
        self.workers = {}        # key -> Worker
        self.gone = []           # exited workers whose sockets may close
        self.events = []         # warnings to raise in the main thread
        self.posted = collections.deque()   # (generation, job): post()
        # Whether the receiver thread reads each finished batch's stacked
        # arrays (``_read_ahead``): set while batches go in groups
        # (``set_read_ahead``).
        self.read_ahead = False
        self.closed = False
        # The worker whose messages are being changed: when an exception
        # interrupts that, its stream may end inside a message, or its
        # tasks be recorded wrongly: it is retired.  (A Ctrl-C waits for
        # the end of submit(): retiring a worker at every interrupt had a
        # storm of them start workers faster than spawn could.)
        self._touched = None
        self._n_workers = n_workers
        self._next_worker_id = 0
        self._start_failures = 0
        self._warned_no_room = False
        # Under spawn and forkserver the large arrays of the dataset go to
        # the workers as shared memory, which lives as long as the pool.
        self.shared_arrays = None
        if ctx.get_start_method() == 'fork':
            # Forked now, while this pool has no thread of its own.
            self.launcher = ForkLauncher(ctx, (
                dataset, seed, n_workers, worker_init_fn, max_tasks))
        else:
            self.shared_arrays = share.ArrayShare()
            # The worker_init_fn travels in the dataset's pickle: what a
            # notebook defines goes by value, and a worker_init_fn that sets
            # a global the dataset reads must set the dataset's copy of it.
            self.launcher = ProcessLauncher(ctx, (
                share.Shipped((dataset, worker_init_fn), self.shared_arrays),
                seed, n_workers, None, max_tasks))
        forks.POOLS.add(self)
        self.receiver = receiver.Receiver(self)
        try:
            if self.shared_arrays is not None:
                self.shared_arrays.defer()
            for _ in range(n_workers):
                self.start_worker()
            # The arrays are copied into shared memory while the workers
            # start Python; then they may read them.
            if self.shared_arrays is not None and self.shared_arrays.fill():
                for worker in self.workers.values():
                    worker.outbox.put_object(('ready',))
            self.receiver.start()
        except BaseException:
            self.close()
            raise

    # ---- workers ---------------------------------------------------------

    def start_worker(self):
        """Start one worker (the main thread while the pool is built,
        then the receiver thread, under the lock)."""
        worker_id = self._next_worker_id % self._n_workers
        self._next_worker_id += 1
        worker = Worker(worker_id, self.launcher.start(worker_id))
        self.book.add_worker(worker.key)
        self.workers[worker.key] = worker
        self.receiver.wake()       # so that it watches the new worker
        if self.shared_arrays is not None:
            message = self.shared_arrays.warning()
            if message is not None:
                self.events.append((SharedMemoryWarning, message))

    def replenish(self):
        """Start workers until enough take tasks; give them the tasks that
        waited for one (receiver thread, under the lock)."""
        if self.book.failure is not None or self.closed:
            return
        try:
            while self.book.short_of_workers():
                self.start_worker()
        except OSError as e:
            # Out of descriptors or processes: try again at the next look;
            # give up only when no worker is left to load anything.
            self._start_failures += 1
            if self.book.accepting() and self._start_failures < 100:
                if self._start_failures == 1:
                    self.events.append((WorkerRestartWarning, (
                        'a worker process could not be started ({}); the '
                        'others go on, and it is tried again'.format(e))))
            elif not self.book.accepting() and self._start_failures >= 10:
                self._put_ready(self.book.fail_all(
                    'no worker process could be started: {}. Raise the '
                    'limit (ulimit -n for descriptors, ulimit -u for '
                    'processes) or lower n_processes or n_prefetch'.format(
                        e), e))
                return
            self.receiver.retry_later()
        except Exception as e:
            # Under spawn and forkserver the dataset is pickled for each
            # worker (a replacement too: maxtasksperchild, a death), and
            # that may fail the second time: another try would too.
            self._put_ready(self.book.fail_all(
                'a new worker process could not start: starting it raised '
                '{}: {} (under the {!r} start method the dataset and '
                'worker_init_fn are pickled for every worker, those that '
                'replace a worker after maxtasksperchild or a death '
                'too). No more workers are started; fix the cause and '
                'build a new iterator'.format(
                    type(e).__name__, e, self.method), e))
            return
        else:
            self._start_failures = 0
        for task in self.book.take_unassigned():
            self._send_task(task)

    def _retire(self, worker):
        """It takes no more tasks (either thread, under the lock)."""
        self.book.retire(worker.key)
        worker.outbox.shut()

    def _send_task(self, task, main_thread=False):
        """Record ``task`` for a worker and send it (either thread, under
        the lock; ``main_thread``: the caller is the main thread)."""
        # Recorded before it is sent: a task that may have been sent is
        # one whose slot is busy.
        key = self.book.assign(task)
        if self.book.short:
            self.receiver.want()   # it starts workers
        if key is None:
            return
        worker = self.workers[key]
        if main_thread:            # only there may an interrupt land
            self._touched = worker
        worker.send_task(task, self.slots.buffers)
        self._touched = None
        if worker.outbox.dead:
            # It died (its exit will give its tasks to others), or a write
            # to it was cut short: it must take no more tasks.
            self._retire(worker)

    def _flushed(self):
        """Wake the receiver thread when a message waits in an outbox
        (either thread, under the lock)."""
        if any(w.outbox.pending for w in self.workers.values()):
            self.receiver.want()

    # ---- the main thread's side -------------------------------------------

    def submit(self, step, seed, cuts=()):
        """Send a batch to the workers (after what was posted); returns
        its handle, for ``wait`` (main thread; takes the lock)."""
        # Uninterrupted: a Ctrl-C between recording a task and sending it
        # would leave it held by its worker for good (and its slot busy).
        # The wait for the lock stays interruptible.
        with self.lock, uninterrupted():
            self._submit_posted()
            return self._submit(step, seed, cuts)

    def post(self, job, wake=True):
        """Have the receiver thread submit ``job`` soon, in the order
        posted: it sets ``job.handle`` to ``submit(*job.task())`` (or
        ``job.error``, see ``submit_posted``).  The caller only queues it:
        the submission's bookkeeping and messages (0.3 ms of a group of
        small batches), and the worker they wake, which on a busy machine
        takes the caller's CPU, fall between the main thread's ``next()``
        calls, while it trains.  A job posted before ``new_generation`` is
        dropped.  Without ``wake`` the caller calls ``wake_posted`` in a
        later ``next()``.  (Main thread, without the lock: an append to
        the deque is atomic.)"""
        self.posted.append((self.book.generation, job))
        if wake:
            self.wake_posted()

    def wake_posted(self):
        """Have the receiver thread submit what was posted now (main
        thread, without the lock)."""
        # It does when it next wakes, as it does for each result while
        # batches are loading (and it does not rest); else it is woken
        # now.  The wake-up (a release of the lock it rests on) costs the
        # caller 0.01-0.03 ms: the woken thread may take its CPU for a
        # moment.
        if self.posted and (not self.book.inflight or
                            self.receiver.resting):
            self.receiver.nudge()

    def submit_posted(self, keep_errors=False):
        """Submit what was posted, in order: the receiver thread's side of
        ``post``, or the main thread's when it needs a job's handle
        before the receiver thread got to it (under the lock: that thread
        may be submitting it).  With ``keep_errors`` (the receiver
        thread) what a job raises is kept as its ``error``, for the main
        thread to raise from the ``next()`` that needs it (that ``next()``
        then rewinds, and the jobs after it are dropped with their
        generation).  Takes the lock."""
        with self.lock, uninterrupted():
            self._submit_posted(keep_errors)

    def _submit_posted(self, keep_errors=False):
        """``submit_posted``'s work (either thread, under the lock)."""
        posted = self.posted
        while posted:
            generation, job = posted.popleft()
            if generation != self.book.generation:
                continue
            try:
                job.handle = self._submit(*job.task())
            except Exception as e:
                if not keep_errors:
                    raise
                job.error = e

    def _submit(self, step, seed, cuts):
        book = self.book
        # The receiver thread may rest when nothing is loading: it must
        # read this batch's results.
        idle = not book.inflight
        slot = self._free_slot()
        buffers = self.slots.buffers if slot is not None else None
        batch, tasks = book.open_batch(
            step, seed, slot, buffers,
            -1 if slot is None else slot.index,
            -1 if buffers is None else buffers.id, cuts)
        if slot is not None:
            slot.owner = (batch.generation, batch.seq)
        if book.failure is not None:
            self._put_ready(book.ready_failed(batch))
        for task in tasks:
            self._send_task(task, main_thread=True)
        self._flushed()
        if idle and self.receiver.resting:
            self.receiver.nudge()
        return batch.generation, batch.seq

    def _free_slot(self):
        """A free slot for a new batch, or None (either thread, under the
        lock: a posted group's slot is allocated in the receiver
        thread)."""
        try:
            return self.slots.free(self.book.generation,
                                   self.book.busy_slots)
        except (MemoryError, OSError) as e:
            self.events.append((SharedMemoryWarning, (
                'no room for one more shared-memory slot ({} of the {} that '
                'n_prefetch={} may use are in use), so batches that find no '
                'free slot come by copy, which is slower; lower n_prefetch '
                'or raise the limit: {}'.format(
                    len(self.slots.buffers.allocated()), self.slots.n_slots,
                    self.book.n_prefetch, e))))
            return None

    def wait(self, handle, timeout):
        """The finished ``Batch`` of ``handle``; warns every ``timeout``
        seconds while waiting (main thread, without the lock; the hand-out
        counts for the active workers, which are the main thread's:
        ``book.handed_out``)."""
        generation, seq = handle
        box = self._box
        waited = not box and self.ready.empty()
        while True:
            self.raise_events()
            if not box:
                # What the ready queue gives goes into the box within
                # C calls (map calls get, extend appends what it
                # returns), where no signal handler runs: a Ctrl-C
                # raised by get takes nothing, and once get has taken
                # an item, no Ctrl-C can drop it on its way.
                self.waiting = True
                try:
                    box.extend(map(self.ready.get, _BLOCK, (
                        timeout if timeout else receiver.POLL_S,)))
                except queue.Empty:
                    # Handled outside the except block: a Ctrl-C landing
                    # in the handling would print queue.Empty's traceback
                    # too.
                    pass
                self.waiting = False
            batch = box.popleft() if box else None
            if batch is None:
                if timeout:
                    warnings.warn(
                        'no batch arrived for {} seconds (dataset_timeout); '
                        'a dataset[i] may be stuck. The iterator goes on '
                        'waiting'.format(timeout), TimeoutWarning,
                        stacklevel=4)
                if self.closed:
                    batch = _CLOSED
                elif not self.receiver.is_alive():
                    raise ChainiterError(
                        'the receiver thread of MultiprocessIterator died'
                    ) from None
                else:
                    continue
            if batch is _CLOSED or self.closed:
                self.ready.put(_CLOSED)    # for any other waiter
                raise IteratorFinalizedError(
                    'MultiprocessIterator was finalized while next() waited '
                    'for a batch')
            self.receiver.consumed()
            if isinstance(batch, BaseException):
                raise batch
            if batch.generation == generation and batch.seq == seq:
                self.raise_events()
                self.book.handed_out(waited, time.perf_counter(),
                                     len(batch.step))
                return batch

    def n_ready(self):
        """The finished batches that wait in order for ``wait`` (main
        thread)."""
        return self.ready.qsize() + len(self._box)

    def interrupted_waiting(self):
        """Whether the exception going up from ``wait`` (a Ctrl-C) came
        while it blocked with nothing taken: every batch in flight or
        ready is then where it was, for the next ``wait``.  Asked once
        (main thread)."""
        waiting, self.waiting = self.waiting, False
        return waiting

    def take(self, handle):
        """The finished batch of ``handle`` when it is the next ready and
        was read ahead (``_read_ahead``), else None, without waiting:
        whatever else is next stays for ``wait``.  The iterator takes a
        group's batch so while it hands out the group before, to spread
        its bookkeeping over the ``next()`` calls.  (Main thread, without
        the lock, as ``wait``.)"""
        if self.closed:
            return None
        box = self._box
        if not box:
            try:
                box.append(self.ready.get_nowait())
            except queue.Empty:
                return None
        batch = box[0]
        if type(batch) is not Batch or batch.prepared is None or \
                batch.seq != handle[1] or batch.generation != handle[0]:
            return None
        box.clear()
        self.receiver.consumed()
        self.book.handed_out(False, time.perf_counter(), len(batch.step))
        return batch

    def raise_events(self):
        """Raise the warnings the pool kept (main thread; takes the lock
        only when some wait)."""
        if not self.events:
            return
        with self.lock:
            events, self.events = self.events, []
        for category, message in events:
            warnings.warn(message, category, stacklevel=5)

    def hand_out(self, batch):
        """Mark the batch's slot as viewed by the user; return the exporter
        that every array of the hand-out must view (None: no slot).  Main
        thread; takes the lock for a batch not read ahead."""
        if batch.slot is None:
            return None
        if batch.prepared is not None:      # its exporter in the slot
            self.slots.hand_over(batch.slot)
            return batch.prepared[0]
        exporter = self.slots.exporter(batch)
        with self.lock:
            self.slots.lease(batch.slot, exporter)
        return exporter

    def new_generation(self):
        """Drop every batch in flight (their results are ignored).  Main
        thread; takes the lock."""
        with self.lock, uninterrupted():
            if self._touched is not None:
                # An exception interrupted a send: that worker finishes
                # what it has, then exits; a new one takes over.
                self._retire(self._touched)
                self._touched = None
            for worker in self.workers.values():
                if worker.outbox.is_torn():
                    self._retire(worker)
            self.posted.clear()
            self.book.new_generation()
            self._drop_ready()
            self.waiting = False
        self.receiver.want()

    def _drop_ready(self):
        """Drop the finished batches waiting for ``wait`` (all of earlier
        generations now): those read ahead hold their slots while they
        are referenced.  What else waits there (an error, ``_CLOSED``)
        stays.  (Main thread, under the lock.)"""
        kept = [item for item in self._box if type(item) is not Batch]
        self._box.clear()
        while True:
            try:
                item = self.ready.get_nowait()
            except queue.Empty:
                break
            if type(item) is not Batch:
                kept.append(item)
        for item in kept:
            self.ready.put(item)

    def set_depth(self, depth):
        """Batches in flight from now on (the chunking follows it).  Main
        thread; takes the lock."""
        with self.lock:
            self.book.set_depth(depth)

    def use_layout(self, layout):
        """Switch to buffers for ``layout`` (MemoryError: no room).  Main
        thread; takes the lock."""
        with self.lock:
            self.slots.replace(layout)   # sent to each worker with a task

    def set_read_ahead(self, on):
        """Whether the receiver thread reads each finished batch ahead
        from now on (``_read_ahead``).  Main thread; takes the lock, so
        that the batches made ready together see one setting."""
        with self.lock:
            self.read_ahead = on

    # ---- called by the receiver thread, under the lock ---------------------

    def _put_ready(self, batches):
        """Queue finished batches for ``wait`` (under the lock: the
        receiver thread, or the main thread for a batch that fails as it
        is submitted)."""
        for batch in batches:
            if self.read_ahead:
                self._read_ahead(batch)
            self.ready.put(batch)

    def _read_ahead(self, batch):
        """Read the stacked arrays of a finished batch now (in the
        receiver thread, while the main thread trains), for ``hand_out``
        and the iterator to take as they are (``batch.prepared``): the
        ``next()`` that takes a group's first batch then does no more than
        the others.  Only the common case: every chunk loaded, every
        example in its rows, one array per field.  The slot holds the
        exporter now, and is the batch's until ``hand_out``: it is free
        again once the arrays are gone and the batch is handed out or of
        an earlier generation (``new_generation`` drops those waiting).
        Under the lock, as ``_put_ready``."""
        if batch.failure is not None or batch.slot is None or \
                batch.buffers.layout.mode != 'stacked':
            return
        chunks = []
        for i in range(batch.n_chunks):
            result = batch.results[i]
            if result.error is not None:
                return
            if type(result.metas) is wire.Parts:     # a padded group's
                chunks.extend(result.metas.metas)
            else:
                chunks.append(result.metas)
        try:
            exporter = self.slots.exporter(batch)
            stacked, _, oversize = read.read_batch(
                numpy.frombuffer(exporter, dtype=numpy.uint8),
                batch.buffers.layout, chunks)
        except Exception:
            return      # the main thread reads it, and raises what it may
        if stacked is not None and not oversize:
            batch.prepared = (exporter, stacked)
            self.slots.view(batch.slot, exporter)

    def on_result(self, worker, generation, seq, chunk, payload):
        """A worker's result (receiver thread, under the lock)."""
        self._put_ready(self.book.on_result(worker.key, generation, seq,
                                            chunk, payload))

    def on_no_room(self, size, reason):
        """A worker could not reserve a slot's memory (receiver thread,
        under the lock)."""
        if not self._warned_no_room:
            self._warned_no_room = True
            self.events.append((SharedMemoryWarning, (
                'a worker could not reserve a shared-memory slot of {:,} '
                'bytes ({}): the file system that holds the buffers is '
                'full, so the batches for that slot come by copy, which is '
                'slower. Enlarge /dev/shm (e.g. docker run --shm-size=...) '
                'or lower n_prefetch'.format(size, reason))))

    def on_startup_failure(self, worker, remote):
        """A worker could not start: start no more (they would fail the
        same way, forever), and fail every batch with the real cause
        (receiver thread, under the lock)."""
        if self.book.failure is not None:
            return
        cause = remote.exception
        if cause is None:
            cause = ChainiterError('{}: {}'.format(remote.type_name,
                                                   remote.message))
        cause.__cause__ = RemoteTraceback(remote.traceback)
        self._put_ready(self.book.fail_all(
            'worker process {} could not start: {}. No more workers are '
            'started; fix the cause and build a new iterator'.format(
                worker.id, remote.message), cause))

    def on_exit(self, launched):
        """A worker has exited (receiver thread, under the lock)."""
        worker = self.workers.get(launched.key)
        if worker is None:
            return
        self.receiver.drain(worker)  # results it sent before exiting
        del self.workers[launched.key]
        self.gone.append(worker)
        code = launched.exitcode
        how = 'an unknown exit status' if code is None else \
            'exit code {}'.format(code) if code >= 0 else \
            'signal {}'.format(-code)
        if code == -9:
            how += ' (SIGKILL: probably killed by the OOM killer)'
        died_with = '(pid {}) died with {}'.format(launched.pid, how)
        self.receiver.want()         # a new worker may be needed
        if code == 1 and not worker.started and not self.closed:
            # Python's own start-up failed (an exception before the worker
            # ran): another worker would fail the same way.
            self._put_ready(self.book.fail_all(
                'worker process {} {} before it started: Python could not '
                'start it (a worker prints the traceback). Under the {!r} '
                'start method a worker first imports the main script (as '
                '__mp_main__); most often the script builds the iterator at '
                'top level, outside "if __name__ == \'__main__\':", and that '
                'fails there. Put the script\'s code under that guard, or '
                'use start_method="fork". No more workers are '
                'started'.format(
                    worker.id, died_with, self.method), None))
        outcome = self.book.worker_exited(launched.key, code, died_with)
        if self.closed:
            return
        if outcome.unexpected:
            self.events.append((WorkerRestartWarning, (
                'worker process {} {}; a new worker takes over and {} '
                'unfinished chunk(s) are loaded again'.format(
                    worker.id, died_with, len(outcome.lost)))))
        self._put_ready(outcome.ready)
        if not self.launcher.alive:
            self._put_ready(self.book.fail_all(
                'the process that starts the worker processes (pid {}) '
                'died, and the workers with it; build a new iterator (a '
                'snapshot taken before resumes exactly)'.format(
                    self.launcher.process.pid), None))
            return
        self.replenish()
        for task in outcome.lost:
            self._send_task(task)

    # ---- shutdown ----------------------------------------------------------

    def close(self):
        """End the workers and the receiver thread and unmap the slots
        (any thread: the main thread, or the one where a finalizer runs;
        it stops the receiver thread before it touches what that
        thread uses)."""
        if self.closed or os.getpid() != self.owner:
            # A forked child's copy: the workers and buffers are the
            # parent's, and its threads and locks are not usable here.
            return
        # All of it or nothing: a Ctrl-C (or a handler that raises) in the
        # middle would leave workers, threads and slots that nothing ends
        # later (the finalizer has run); it is raised once all is closed.
        with uninterrupted():
            self.closed = True
            self.ready.put(_CLOSED)
            if self.receiver.is_alive():
                self.receiver.stop()
            # Batches read ahead view their slots: drop them, so that the
            # slots are unmapped now (and _CLOSED goes back for any waiter).
            self._box.clear()
            while True:
                try:
                    self.ready.get_nowait()
                except queue.Empty:
                    break
            self.ready.put(_CLOSED)
            for worker in self.gone:
                worker.close()
            for worker in list(self.workers.values()):
                # Without waiting: a worker whose socket is full (it may be
                # blocked writing a result no one reads now) is stopped by
                # the launcher instead.
                worker.outbox.put_object(None)   # exit after the task at hand
                worker.close()
            self.workers = {}
            self.launcher.close()
            self.receiver.close()
            self.slots.release()
            if self.shared_arrays is not None:
                self.shared_arrays.release()
