"""The pool's workers: starting them, a batch cut into tasks and sent to
them (with its slot), and what their messages and exits mean.

A part of ``Pool`` (``pool.py``), mixed into it: its methods use the
pool's state, as the table under "Threads" in ``__init__.py`` says.  All
of them run under the pool's lock (but ``start_worker`` while the pool is
built), most in the receiver thread; each says which.
"""

from chainiter.errors import (
    ChainiterError, SharedMemoryWarning, WorkerRestartWarning)
from chainiter.iterators.pipeline.flow.remote import RemoteTraceback


class PoolWorkers:
    """``Pool``'s side of its workers (``self.workers``, ``self.launcher``,
    and the book's record of what each holds)."""

    def start_worker(self):
        """Start one worker (the main thread while the pool is built,
        then the receiver thread, under the lock)."""
        # The id that no worker taking tasks has: a replacement takes the
        # id of the worker it replaces, and counts as its next incarnation.
        taken = {self.workers[key].id for key in self.book.accepting()
                 if key in self.workers}
        worker_id = min(set(range(self._n_workers)) - taken)
        incarnation = self._incarnations[worker_id]
        worker = self.handle(worker_id, self.launcher.start(worker_id,
                                                            incarnation))
        self._incarnations[worker_id] += 1
        self.book.add_worker(worker.key)
        self.workers[worker.key] = worker
        worker.start()
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
            # Not a shortage: another try would fail the same way.  (The
            # dataset is pickled once, at the first start, which the pool's
            # construction raises: a replacement gets those bytes.)
            self._put_ready(self.book.fail_all(
                'a new worker process could not start: starting it raised '
                '{}: {} (start method {!r}). No more workers are started; '
                'fix the cause and build a new iterator'.format(
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
        worker.send_task(task, self.slots.buffers_of(task))
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

    def _submit(self, step, seed, cuts=(), weight=1):
        book = self.book
        # The receiver thread may rest when nothing is loading: it must
        # read this batch's results.
        idle = not book.inflight
        slot = self._free_slot()
        buffers = self.slots.buffers if slot is not None else None
        batch, tasks = book.open_batch(
            step, seed, slot, buffers,
            -1 if slot is None else slot.index,
            -1 if buffers is None else buffers.id, cuts, weight)
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
                    self.batches_ahead, e))))
            return None

    def on_result(self, worker, generation, seq, chunk, loaded):
        """A worker's result, unpickled (``wire.load_result``) before the
        lock was taken (receiver thread, under the lock)."""
        self._put_ready(self.book.on_result(worker.key, generation, seq,
                                            chunk, loaded))

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
        if launched.pid is None:     # a worker thread: no exit status
            died_with = 'worker thread {} ended{}'.format(
                worker.id, '' if launched.error is None else
                ' with an uncaught ' + launched.error)
        else:
            died_with = 'worker process {} (pid {}) died with {}'.format(
                worker.id, launched.pid, _exit_status(code))
        self.receiver.want()         # a new worker may be needed
        if code == 1 and not worker.started and not self.closed:
            # Python's own start-up failed (an exception before the worker
            # ran): another worker would fail the same way.
            self._put_ready(self.book.fail_all(
                '{} before it started: Python could not '
                'start it (a worker prints the traceback). Under the {!r} '
                'start method a worker first imports the main script (as '
                '__mp_main__); most often the script builds the iterator at '
                'top level, outside "if __name__ == \'__main__\':", and that '
                'fails there. Put the script\'s code under that guard, or '
                'use start_method="fork". No more workers are '
                'started'.format(died_with, self.method), None))
        outcome = self.book.worker_exited(launched.key, code, died_with)
        if self.closed:
            return
        if outcome.unexpected:
            self.events.append((WorkerRestartWarning, (
                '{}; a new worker takes over and {} '
                'unfinished chunk(s) are loaded again'.format(
                    died_with, len(outcome.lost)))))
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


def _exit_status(code):
    """A worker process's exit status, in words."""
    if code is None:
        return 'an unknown exit status'
    if code >= 0:
        return 'exit code {}'.format(code)
    how = 'signal {}'.format(-code)
    if code == -9:
        how += ' (SIGKILL: probably killed by the OOM killer)'
    return how
