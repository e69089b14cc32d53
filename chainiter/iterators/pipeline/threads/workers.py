"""Worker threads: the pool's workers when ``MultithreadIterator`` drives
it.

The pipeline is the same as with worker processes (the book, the slots,
the groups, the reorder, the depth): only the boundary differs.  A
worker thread takes its tasks from a queue, writes the examples into
the slot's memory (the process's own: ``SharedBuffer.private``), and
hands its result to the pool itself, under the pool's lock
(``Pool.on_result``), where a worker process's result travels through a
socket to the receiver thread.  Nothing is pickled and no file is made;
there is no receiver thread: a worker that delivers a result also
submits what the main thread posted (a group of small batches), and the
main thread submits it when no worker is loading.

``Threads`` is what the pool is given for them (``boundary.Processes``
for processes); three classes have the interfaces of their process
counterparts: ``ThreadLauncher`` (``launch.py``), ``ThreadWorker``
(``worker_handle.py``) and ``NoReceiver`` (``receiver.py``).
"""

import collections
import itertools
import os
import queue
import sys
import threading
import time
import weakref

import numpy

from chainiter import _context
from chainiter._interrupts import uninterrupted
from chainiter.iterators._state import Step
from chainiter.iterators.pipeline.memory import converted
from chainiter.iterators.pipeline.flow.loading_mode import LoadingMode
from chainiter.iterators.pipeline.pool import load
from chainiter.iterators.pipeline.flow import remote

_JOIN_TIMEOUT_S = 5.0     # close() waits this long for the threads in all


class _Inbox:
    """A worker thread's tasks: the ``Outbox`` of a worker process, but a
    queue (a put never blocks, and never tears)."""

    pending = False
    dead = False

    def __init__(self):
        self.queue = queue.SimpleQueue()

    @staticmethod
    def is_torn():
        return False

    def put_object(self, message):
        """None: exit once the tasks before it are done (the other
        messages of a process, ``('ready',)``, mean nothing here)."""
        if message is None:
            self.queue.put(None)

    def shut(self):
        """Take no more tasks: exit once those queued are done."""
        self.queue.put(None)

    def close(self):
        pass


class _Launched:
    """A started worker thread (``launch.Launched``'s counterpart): its
    key, its inbox (as ``conn``), the thread (as ``process``)."""

    pid = None

    def __init__(self, key, inbox):
        self.key = key
        self.conn = inbox
        self.process = None
        self.exitcode = None
        self.error = None      # 'Type: message' of what ended the thread
        self.main = None       # the pool's MainThreadTasks
        self.info = None       # its WorkerInfo


class ThreadWorker:
    """A worker thread as the pool sees it."""

    started = True          # no interpreter to start
    at_eof = False
    conn = None

    def __init__(self, worker_id, launched):
        self.id = worker_id
        self.key = launched.key
        self.outbox = launched.conn       # its _Inbox
        self.info = launched.info
        self._thread = launched.process
        self._main = launched.main

    def start(self):
        """Start the thread, now that the pool has this handle (the thread
        reports to the pool by its key)."""
        self._thread.start()

    def send_task(self, task, buffers):
        """Queue a task, with the memory of its slot (``buffers``: those
        of the task's slot, or None)."""
        memory = layout = None
        if buffers is not None:
            memory = buffers.slots[task.slot].shared.buffer
            layout = buffers.layout
        if self._main.on:
            self._main.tasks.append((self, (task, memory, layout)))
        else:
            self.outbox.queue.put((task, memory, layout))

    def close(self):
        pass


class Threads:
    """The pool's workers as threads (``Processes``' counterpart,
    ``boundary.py``).  ``may_load_here``: on a build with the GIL, the
    main thread may load the tasks itself when that is faster
    (``MainThreadTasks``); not with an explicit ``n_prefetch``, which
    asks for batches loaded ahead."""

    method = 'threads'
    handle = ThreadWorker

    def __init__(self, may_load_here=True, probe=()):
        self.may_load_here = may_load_here
        self.probe = probe      # LoadingMode's first_probe_s, window_s,
        #                         window_batches

    def connect(self, pool, dataset, seed, n_workers, worker_init_fn,
                max_tasks):
        """Give ``pool`` its launcher and its stand-in receiver.  (Not in
        ``forks.POOLS``: the slots are private memory, which a forked
        child has a copy of.)"""
        where = where_to_load(self.may_load_here)
        pool.launcher = ThreadLauncher(pool, (
            dataset, seed, n_workers, worker_init_fn, max_tasks))
        pool.receiver = NoReceiver(pool)
        pool.main_tasks = main = pool.launcher.main
        if where == 'main':
            main.switch(pool, True)
        if where == 'auto':
            main.mode = LoadingMode(*self.probe)


#: The environment variable that says where a MultithreadIterator loads.
WHERE_VARIABLE = 'CHAINITER_THREAD_LOADING'
_WHERE = ('auto', 'threads', 'main')


def where_to_load(may_load_here):
    """``'threads'``, ``'main'`` or ``'auto'`` (measured:
    ``LoadingMode``), from ``CHAINITER_THREAD_LOADING`` (default
    ``auto``), the build (without the GIL the threads load in parallel)
    and ``may_load_here``."""
    where = os.environ.get(WHERE_VARIABLE, '').strip().lower() or 'auto'
    if where not in _WHERE:
        raise ValueError(
            '{}={!r}: use one of {} (auto: the iterator measures which '
            'is faster on a build with the GIL)'.format(
                WHERE_VARIABLE, os.environ[WHERE_VARIABLE],
                ', '.join(_WHERE)))
    if where == 'auto' and not (may_load_here and gil_enabled()):
        return 'threads'
    return where


def gil_enabled():
    """Whether this interpreter runs with the GIL (a free-threaded build
    can turn it back on: ``sys._is_gil_enabled``)."""
    is_enabled = getattr(sys, '_is_gil_enabled', None)
    return True if is_enabled is None else bool(is_enabled())


class NoReceiver:
    """What the pool asks of its receiver thread, where there is none:
    worker threads deliver their results themselves."""

    resting = False
    sleeping = False

    def __init__(self, pool):
        self._pool = weakref.ref(pool)
        self._stopped = False

    def start(self):
        pass

    def is_alive(self):
        return not self._stopped

    def nudge(self):
        """Submit what was posted now (the main thread, without the lock;
        ``Pool.wake_posted`` calls it when no worker is loading, so none
        would submit it)."""
        pool = self._pool()
        if pool is not None and pool.posted:
            pool.submit_posted(keep_errors=True)

    def wake(self):
        pass

    want = retry_later = consumed = close = wake

    def drain(self, worker):
        pass

    def stop(self):
        self._stopped = True


class ThreadLauncher:
    """Starts worker threads; ``start``, ``watched``, ``exits`` and
    ``close`` as ``ProcessLauncher``'s.  A thread reports its own exit to
    the pool (``Pool.on_exit``, under the lock)."""

    alive = True
    process = None

    def __init__(self, pool, pool_args):
        self._pool = weakref.ref(pool)
        self._args = pool_args
        self._keys = itertools.count()
        self._threads = {}       # key -> Thread
        self.main = MainThreadTasks(pool, pool_args)

    def start(self, worker_id, incarnation):
        key = next(self._keys)
        launched = _Launched(key, _Inbox())
        dataset, seed, n_workers = self._args[:3]
        launched.main = self.main
        launched.info = _context.WorkerInfo(
            worker_id, n_workers,
            seed + load.worker_stream(worker_id, n_workers, incarnation),
            incarnation)
        # Started by ThreadWorker.start, once the pool knows it.
        launched.process = threading.Thread(
            target=_thread_main, name='chainiter-worker-{}'.format(worker_id),
            args=(self._pool, launched, worker_id, incarnation) + self._args,
            daemon=True)
        self._threads[key] = launched.process
        return launched

    @staticmethod
    def watched():
        return []

    @staticmethod
    def exits(ready):
        return []

    @staticmethod
    def processes():
        return []

    def close(self):
        """Wait (a bounded time) for the threads, told to exit: one inside
        a ``dataset[i]`` that does not return is left to end by itself
        (its result is dropped)."""
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        current = threading.current_thread()
        for thread in list(self._threads.values()):
            if thread is not current and thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        self._threads.clear()
        self.main.close()


class MainThreadTasks:
    """The tasks that the main thread loads itself, in ``next()`` while it
    waits (``Pool.wait``), when the loading goes faster there than in the
    worker threads (``on``; with the GIL, the threads of a dataset that
    holds it only take turns, and pass it back and forth).  Each task
    stays recorded for the worker it was given to, which never sees it:
    the main thread loads it as that worker (its ``get_worker_info()``)
    and delivers the result for it."""

    def __init__(self, pool, pool_args):
        self.on = False
        self.mode = None        # LoadingMode: when it switches by itself
        self.tasks = collections.deque()   # (ThreadWorker, its item)
        self._pool = weakref.ref(pool)
        self._dataset = pool_args[0]
        self._unwrapped = None   # (dataset, converter, batched)
        self._clock = None

    def switch(self, pool, on):
        """Load in the main thread from now on (``on``), with the tasks
        that no thread has begun, or in the worker threads, which get the
        tasks queued here (under the pool's lock)."""
        if on == self.on:
            return
        self.on = on
        # One group ahead (Pipeline._prefetch_depth): a few slots in turn.
        pool.slots.lowest_first = on
        tasks = self.tasks
        if not on:
            while tasks:
                worker, item = tasks.popleft()
                if pool.workers.get(worker.key) is worker:
                    worker.outbox.queue.put(item)
            return
        taken = []
        for worker in list(pool.workers.values()):
            inbox = worker.outbox.queue
            items = []
            while True:
                try:
                    items.append(inbox.get_nowait())
                except queue.Empty:
                    break
            if None in items:
                # Shut: it exits once done (after the tasks before).
                inbox.put(None)
            taken.extend((worker, item) for item in items
                         if item is not None)
        # In the order they were sent: the oldest batch first.
        taken.sort(key=lambda queued: (queued[1][0].generation,
                                       queued[1][0].seq,
                                       queued[1][0].chunk))
        tasks.extend(taken)

    def handed_out(self, examples, depth):
        """``next()`` handed out a batch of ``examples``, ``depth`` sent
        behind it: switch when ``mode`` says so.  (Main thread.)"""
        pool = self._pool()
        # What a switch finds loaded the other way: the threads' batches,
        # ready or loading; from the main thread, the tasks they begin
        # with (it loads only what next() waits for).
        in_flight = depth if not self.on or pool is None else \
            len(pool.workers)
        to = self.mode.handed_out(time.monotonic(), examples, in_flight)
        if to is not None and pool is not None:
            with pool.lock, uninterrupted():
                if not pool.closed:
                    self.switch(pool, to)

    def run_one(self):
        """Load the oldest task queued here and deliver its result; False
        when none is queued.  What ``dataset[i]`` raises is the task's
        error, as a worker thread's would be (``next()`` raises it from
        the batch that holds the example); a Ctrl-C (any exception that
        is not an ``Exception``) goes up from ``next()`` and leaves the
        task first in the queue, to be loaded again by the next call.
        (Main thread, without the lock.)"""
        tasks = self.tasks
        pool = self._pool()
        if not tasks or pool is None or pool.closed:
            return False
        queued = tasks[0]
        worker, item = queued
        task = item[0]
        if self._clock is None:
            with uninterrupted():      # its descriptor is closed by close()
                self._clock = load.RunQueueClock()
        if self._unwrapped is None:
            dataset, converter = converted.unwrap(self._dataset)
            self._unwrapped = (dataset, converter,
                               _context.batch_method(dataset) is not None)
        dataset, converter, batched = self._unwrapped
        result = None
        if pool.workers.get(worker.key) is worker and \
                task.generation == pool.book.generation:
            caller = _context.set_thread_worker_info(worker.info)
            try:
                result = _run(item, dataset, converter, batched,
                              self._clock, remote.capture_in_main)
            finally:
                _context.set_thread_worker_info(caller)
        with pool.lock, uninterrupted():
            if tasks and tasks[0] is queued:     # (close() clears them)
                tasks.popleft()
            if not pool.closed and pool.workers.get(worker.key) is worker:
                # A task of an older generation: its record goes (the
                # book ignores what it holds).
                pool.on_result(worker, task.generation, task.seq,
                               task.chunk, ([], None) if result is None
                               else result)
        if pool.posted:
            pool.submit_posted(keep_errors=True)
        return True

    def close(self):
        self.tasks.clear()
        clock, self._clock = self._clock, None
        if clock is not None:
            clock.close()


def _thread_main(pool_ref, launched, worker_id, incarnation, dataset, seed,
                 n_workers, worker_init_fn, max_tasks):
    inbox = launched.conn.queue
    launched.exitcode = 0
    try:
        _serve(pool_ref, launched, inbox, worker_id, incarnation, dataset,
               seed, n_workers, worker_init_fn, max_tasks)
    except BaseException as e:
        launched.exitcode = 1
        launched.error = '{}: {}'.format(type(e).__name__, e)
        raise
    finally:
        _context.set_thread_worker_info(None)
        pool = pool_ref()
        if pool is not None and not pool.closed:
            with pool.lock:
                pool.on_exit(launched)


def _serve(pool_ref, launched, inbox, worker_id, incarnation, dataset, seed,
           n_workers, worker_init_fn, max_tasks):
    _context.set_thread_worker_info(launched.info)
    dataset, converter = converted.unwrap(dataset)
    if worker_init_fn is not None:
        try:
            worker_init_fn(worker_id)
        except Exception as e:
            error = remote.capture_here(e, -1)
            _deliver(pool_ref, lambda pool, w: pool.on_startup_failure(
                w, error._replace(message='worker_init_fn({}) raised: '
                                  '{}'.format(worker_id, error.message))),
                launched)
            return
    batched = _context.batch_method(dataset) is not None
    run_queue = load.RunQueueClock()
    try:
        _take_tasks(pool_ref, launched, inbox, dataset, converter, batched,
                    run_queue, max_tasks)
    finally:
        run_queue.close()       # its descriptor: the thread's own


def _take_tasks(pool_ref, launched, inbox, dataset, converter, batched,
                run_queue, max_tasks):
    done = 0
    while max_tasks is None or done < max_tasks:
        item = inbox.get()
        if item is None:
            return
        task = item[0]
        result = _run(item, dataset, converter, batched, run_queue,
                      remote.capture_here)
        del item
        if not _deliver(pool_ref, lambda pool, w: pool.on_result(
                w, task.generation, task.seq, task.chunk, result),
                launched):
            return
        done += task.weight


def _run(item, dataset, converter, batched, run_queue, capture):
    """``load.run_task`` of a queued ``(task, memory, layout)``, with the
    task's indices as a worker process gets them (Python ints)."""
    task, memory, layout = item
    here = task._replace(step=Step(
        numpy.asarray(task.step.indices).tolist(), task.step.spans))
    whole = None if memory is None else \
        numpy.frombuffer(memory, dtype=numpy.uint8)
    return load.run_task(dataset, converter, batched, here, whole, layout,
                         run_queue, capture)


def _deliver(pool_ref, call, launched):
    """``call(pool, worker)`` under the pool's lock, then submit what was
    posted; False when the pool is closed or gone."""
    pool = pool_ref()
    if pool is None or pool.closed:
        return False
    with pool.lock:
        worker_handle = pool.workers.get(launched.key)
        if worker_handle is None:
            return False
        call(pool, worker_handle)
    if pool.posted:
        pool.submit_posted(keep_errors=True)
    return True
