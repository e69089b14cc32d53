"""The dispatch book: the batches in flight, the tasks each worker holds,
and what a result or a worker's exit means for them.

Pure: no processes, threads or I/O.  The pool calls it under its lock and
carries out what it returns (tasks to send, batches that are ready, in
order).  ``tests/test_book.py`` drives it without any process.

A batch is cut into chunks, one ``Task`` each.  Every task carries the
generation it was made in; ``new_generation()`` (a reset, a snapshot
loaded, an exception in ``next()``) drops the batches in flight, and
results of older generations are ignored.
"""


from chainiter.errors import ChainiterError, WorkerDiedError
from chainiter.iterators.pipeline.flow.reorder import Reorderer
from chainiter.iterators.pipeline.flow.active_workers import ActiveWorkers
from chainiter.iterators.pipeline.flow.load_meter import LoadMeter
from chainiter.iterators.pipeline.flow.remote import RemoteError
from chainiter.iterators.pipeline.flow.tasks import Result, Task, Unreadable

MAX_DEATHS_PER_BATCH = 3


class Batch:
    def __init__(self, generation, seq, step, n_chunks, slot, buffers,
                 cuts=()):
        self.generation = generation
        self.seq = seq
        self.step = step
        self.n_chunks = n_chunks
        self.slot = slot           # opaque to the book
        self.buffers = buffers
        self.results = {}
        self.deaths = 0
        self.failure = None        # raised instead of the batch
        self.prepared = None       # (exporter, stacked): Pool._read_ahead
        self.cuts = cuts           # where a group's batches begin (Task)


class _Held:
    """What one worker has been given."""

    def __init__(self):
        self.tasks = {}            # (seq, chunk) -> Task, in the order sent
        self.sent = 0
        self.retired = False       # takes no more tasks


class Exit:
    """What a worker's exit means: ``lost`` are its tasks that are still
    wanted (to give to other workers), ``ready`` the batches that failed
    because of it, ``unexpected`` whether to warn."""

    def __init__(self, lost, ready, unexpected):
        self.lost = lost
        self.ready = ready
        self.unexpected = unexpected


class Book:

    def __init__(self, n_workers, n_jobs_ahead, max_tasks, split=True,
                 cpus=None):
        self.n_workers = n_workers
        # Jobs in flight: batches, or groups of batches (``groups.py``),
        # where the iterator's ``n_prefetch`` counts batches.
        self.n_jobs_ahead = n_jobs_ahead
        self.max_tasks = max_tasks
        # False: every batch goes whole to one worker (a converter there
        # takes whole batches), however few are in flight.
        self.split = split
        self.generation = 0
        self.next_seq = 0
        self.inflight = {}         # seq -> Batch
        self.unassigned = []       # tasks that wait for a worker to start
        self.failure = None        # (message, cause): every batch fails
        self.short = False         # the last assign found too few workers
        self._held = {}            # worker key -> _Held
        self._busy = {}            # buffer id -> {slot: tasks held for it}
        self._reorderer = Reorderer()
        self.meter = LoadMeter()   # the workers' loading, in all
        self.active = n_workers    # how many take tasks (ActiveWorkers)
        self._active_workers = ActiveWorkers(n_workers, cpus)
        self.set_depth(n_jobs_ahead)

    # ---- workers -------------------------------------------------------

    def add_worker(self, key):
        self._held[key] = _Held()

    def retire(self, key):
        if key in self._held:      # else it has exited already
            self._held[key].retired = True

    def accepting(self):
        return [key for key, held in self._held.items()
                if not held.retired and (self.max_tasks is None
                                         or held.sent < self.max_tasks)]

    def short_of_workers(self):
        return len(self.accepting()) < self.n_workers

    def busy_slots(self, buffer_id):
        """Slots that a task given to a worker may still write into (a
        set-like view, kept as tasks come and go)."""
        return self._busy.get(buffer_id, {}).keys()

    def _hold(self, held, task):
        held.tasks[(task.seq, task.chunk)] = task
        counts = self._busy.setdefault(task.buffer_id, {})
        counts[task.slot] = counts.get(task.slot, 0) + 1

    def _release(self, task):
        counts = self._busy[task.buffer_id]
        counts[task.slot] -= 1
        if not counts[task.slot]:
            del counts[task.slot]

    # ---- batches -------------------------------------------------------

    def open_batch(self, step, seed, slot, buffers, slot_index, buffer_id,
                   cuts=(), weight=1):
        """A new batch; returns ``(batch, tasks)``: its tasks, to assign
        (none when every batch fails: the batch is then ready).  ``cuts``
        and ``weight``: see ``Task``."""
        seq = self.next_seq
        self.next_seq += 1
        n = len(step)
        # Every message costs, tiny examples too: split a batch only as
        # much as needed to keep every worker busy with the batches in
        # flight.
        n_chunks = min(n, -(-self.n_workers // self.n_jobs_ahead)) \
            if self.split else 1
        batch = Batch(self.generation, seq, step, n_chunks, slot, buffers,
                      cuts)
        self.inflight[seq] = batch
        if self.failure is not None:
            return batch, []
        if n_chunks == 1:
            return batch, [Task(self.generation, seq, 0, 0, step, slot_index,
                                buffer_id, seed, cuts, weight)]
        bounds = [n * k // n_chunks for k in range(n_chunks + 1)]
        return batch, [
            Task(self.generation, seq, chunk, a, step.cut(a, b), slot_index,
                 buffer_id, seed, cuts, weight)
            for chunk, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]

    def assign(self, task):
        """Record ``task`` for the least busy worker that takes tasks and
        return its key, or None: the task waits in ``unassigned``."""
        keys = self.accepting()
        self.short = len(keys) < self.n_workers
        if not keys:
            self.unassigned.append(task)
            return None
        if len(keys) > self.active:
            keys = keys[:self.active]
        key = min(keys, key=lambda k: len(self._held[k].tasks))
        held = self._held[key]
        self._hold(held, task)
        held.sent += task.weight
        return key

    def set_depth(self, depth):
        """``depth`` batches (or groups) in flight from now on."""
        self.n_jobs_ahead = depth
        if depth >= self.n_workers:
            self.active = self._active_workers.deep()

    def handed_out(self, waited, now, size):
        """A batch of ``size`` examples was handed out at ``now``
        (``waited``: ``next()`` found none ready): ``active`` follows."""
        load = self.meter.sample
        self.active = self._active_workers.batch(
            waited, now, load.load_s, load.loaded, size, load.queued_s)

    def take_unassigned(self):
        tasks, self.unassigned = self.unassigned, []
        return [task for task in tasks if task.generation == self.generation]

    def on_result(self, key, generation, seq, chunk, loaded):
        """A worker's result, as ``wire.load_result`` unpickled it; returns
        the batches now ready, in order."""
        held = self._held.get(key)
        task = None if held is None else held.tasks.pop((seq, chunk), None)
        if task is not None:
            self._release(task)
        if task is None or generation != self.generation:
            return []
        batch = self.inflight.get(seq)
        if batch is None:
            return []
        if type(loaded) is Unreadable:
            e = loaded.error
            metas, error = [], RemoteError(
                None, type(e).__qualname__,
                'the examples of dataset indices {} came back from the '
                'worker but cannot be unpickled in the main process: {}: '
                '{}'.format(short_list(task.indices), type(e).__qualname__,
                            e),
                loaded.traceback, int(task.indices[0]))
        else:
            metas, error = loaded[0], loaded[1]
            if len(loaded) > 2:     # how long the worker took
                self.meter.add(loaded[2], len(task.step),
                               loaded[3] if len(loaded) > 3 else 0.0)
        batch.results[chunk] = Result(generation, seq, chunk, metas, error)
        if len(batch.results) == batch.n_chunks:
            return self._complete(batch)
        return []

    def fail_all(self, message, cause):
        """From now on every batch fails with ``ChainiterError(message)``
        caused by ``cause``; returns the batches now ready."""
        self.failure = (message, cause)
        ready = []
        for batch in list(self.inflight.values()):
            ready += self._fail(batch)
        return ready

    def ready_failed(self, batch):
        """The ready batches once ``batch`` (opened after a failure)
        fails."""
        return self._fail(batch)

    def _fail(self, batch):
        message, cause = self.failure
        batch.failure = ChainiterError(message)
        batch.failure.__cause__ = cause
        batch.results = {}
        return self._complete(batch)

    def _complete(self, batch):
        del self.inflight[batch.seq]
        return self._reorderer.push(batch.seq, batch)

    def worker_exited(self, key, exitcode, died_with):
        """Worker ``key`` has exited (``died_with`` describes how, for
        messages); returns an ``Exit``."""
        held = self._held.pop(key)
        lost = list(held.tasks.values())
        for task in lost:
            self._release(task)
        expected = held.retired or (self.max_tasks is not None
                                    and held.sent >= self.max_tasks)
        if self.failure is not None or (
                not lost and (expected or exitcode == 0)):
            return Exit([], [], False)
        current = [task for task in lost if task.generation == self.generation
                   and task.seq in self.inflight]
        if held.retired and (not current or exitcode == 0):
            # Retired, it finished what it read and left: its tasks that
            # are still wanted go to others, and nobody died.
            return Exit(current, [], False)
        ready = []
        if current:
            # Only the batch it was loading (the oldest task it had)
            # counts this death; the ones queued behind it are innocent.
            loading = self.inflight[current[0].seq]
            loading.deaths += 1
            if loading.deaths >= MAX_DEATHS_PER_BATCH:
                loading.failure = WorkerDiedError(
                    'workers died {} times while loading the batch '
                    'of dataset indices {}; the last: {}. The iterator '
                    'stays at this batch'.format(
                        loading.deaths, short_list(loading.step.indices),
                        died_with))
                loading.results = {}
                ready = self._complete(loading)
        return Exit([task for task in current if task.seq in self.inflight],
                    ready, True)

    def new_generation(self):
        """Drop every batch in flight (their results are ignored)."""
        self.generation += 1
        self.inflight.clear()
        self.unassigned = []
        self._reorderer.reset(self.next_seq)


def short_list(indices, limit=10):
    indices = [int(i) for i in indices]
    if len(indices) <= limit:
        return str(indices)
    return '[{}, ... ({} in all)]'.format(
        ', '.join(map(str, indices[:limit])), len(indices))
