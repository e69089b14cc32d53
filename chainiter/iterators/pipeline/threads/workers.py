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

import itertools
import queue
import threading
import time
import weakref

import numpy

from chainiter import _context
from chainiter.iterators._state import Step
from chainiter.iterators.pipeline.memory import converted
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


class ThreadWorker:
    """A worker thread as the pool sees it."""

    started = True          # no interpreter to start
    at_eof = False
    conn = None

    def __init__(self, worker_id, launched):
        self.id = worker_id
        self.key = launched.key
        self.outbox = launched.conn       # its _Inbox
        self._thread = launched.process

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
        self.outbox.queue.put((task, memory, layout))

    def close(self):
        pass


class Threads:
    """The pool's workers as threads (``Processes``' counterpart,
    ``boundary.py``)."""

    method = 'threads'
    handle = ThreadWorker

    @staticmethod
    def connect(pool, dataset, seed, n_workers, worker_init_fn, max_tasks):
        """Give ``pool`` its launcher and its stand-in receiver.  (Not in
        ``forks.POOLS``: the slots are private memory, which a forked
        child has a copy of.)"""
        pool.launcher = ThreadLauncher(pool, (
            dataset, seed, n_workers, worker_init_fn, max_tasks))
        pool.receiver = NoReceiver(pool)


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

    def start(self, worker_id, incarnation):
        key = next(self._keys)
        launched = _Launched(key, _Inbox())
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
    stream = load.worker_stream(worker_id, n_workers, incarnation)
    _context.set_thread_worker_info(_context.WorkerInfo(
        worker_id, n_workers, seed + stream, incarnation))
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
        task, memory, layout = item
        # The worker's indices, as a process gets them: Python ints.
        here = task._replace(step=Step(
            numpy.asarray(task.step.indices).tolist(), task.step.spans))
        whole = None if memory is None else \
            numpy.frombuffer(memory, dtype=numpy.uint8)
        result = load.run_task(dataset, converter, batched, here, whole,
                               layout, run_queue, remote.capture_here)
        del whole, memory
        if not _deliver(pool_ref, lambda pool, w: pool.on_result(
                w, task.generation, task.seq, task.chunk, result),
                launched):
            return
        done += task.weight


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
