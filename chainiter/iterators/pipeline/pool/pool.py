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

``Pool`` is in four files: here its construction and what the main
thread calls (``submit``, ``post``, ``wait``, ``hand_out``, ...); in
``pool_ready.py`` the ready queue (``take``, the batches read ahead); in
``pool_workers.py``, all under the lock, its workers (starting them, a
batch cut into tasks and sent, their results and exits); in
``pool_close.py`` ``close``.  Which
thread writes and reads what, under which lock: the table under
"Threads" in ``__init__.py``.  Each method says which thread calls it;
"under the lock": its caller holds ``self.lock``.
"""

import collections
import os
import queue
import threading
import time
import warnings

from chainiter._interrupts import uninterrupted
from chainiter.errors import (
    ChainiterError, IteratorFinalizedError, TimeoutWarning)
from chainiter.iterators.pipeline.flow.book import Book
from chainiter.iterators.pipeline.pool.pool_close import CLOSED, PoolClose
from chainiter.iterators.pipeline.pool.pool_ready import ReadyBatches
from chainiter.iterators.pipeline.pool.pool_workers import PoolWorkers

# ``ready.get``'s first argument: block.
_BLOCK = (True,)
POLL_S = 1.0      # the receiver looks at the workers at least this often


class Pool(PoolWorkers, ReadyBatches, PoolClose):
    """It holds no reference to the iterator, so that garbage collection of
    the iterator finalizes the pool.  Its workers' side is in
    ``pool_workers.py``, its ready queue's in ``pool_ready.py``, its
    ``close`` in ``pool_close.py``."""

    def __init__(self, boundary, dataset, n_workers, seed, worker_init_fn,
                 max_tasks, n_jobs_ahead, slots, split=True, cpus=None):
        self.owner = os.getpid()   # only this process may use or close it
        # The workers' kind: processes (``boundary.Processes``) or threads
        # (``threads.Threads``).
        self.method = boundary.method
        self.lock = threading.Lock()
        self.book = Book(n_workers, n_jobs_ahead, max_tasks, split, cpus)
        # The batches in flight, a group's all counted (for messages).
        self.batches_ahead = n_jobs_ahead
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
        # Workers started with each id (WorkerInfo.incarnation).
        self._incarnations = [0] * n_workers
        self._start_failures = 0
        self._warned_no_room = False
        # Under spawn and forkserver the large arrays of the dataset go to
        # the workers as shared memory, which lives as long as the pool.
        self.shared_arrays = None
        # The tasks the main thread loads itself (worker threads only).
        self.main_tasks = None
        # The launcher and the receiver of the workers' kind (and the
        # shared arrays).
        self.handle = boundary.handle
        boundary.connect(self, dataset, seed, n_workers, worker_init_fn,
                         max_tasks)
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
                main = self.main_tasks
                if main is not None:
                    # Loading in this thread (threads.workers), until
                    # the batch is ready or nothing is left to load.
                    while main.tasks and self.ready.empty() and \
                            main.run_one():
                        pass
                try:
                    box.extend(map(self.ready.get, _BLOCK, (
                        timeout if timeout else POLL_S,)))
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
                    batch = CLOSED
                elif not self.receiver.is_alive():
                    raise ChainiterError(
                        'the receiver thread of MultiprocessIterator died'
                    ) from None
                else:
                    continue
            if batch is CLOSED or self.closed:
                self.ready.put(CLOSED)    # for any other waiter
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

    def set_depth(self, depth, batches=None):
        """Jobs (batches, or groups) in flight from now on (the chunking
        follows it), ``batches`` batches (None: as many as jobs).  Main
        thread; takes the lock."""
        with self.lock:
            self.book.set_depth(depth)
            self.batches_ahead = depth if batches is None else batches

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
