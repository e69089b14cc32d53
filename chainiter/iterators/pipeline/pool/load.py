"""Loading a task: what a worker, process or thread, does with one.  The
examples of the task's step are loaded (``dataset[i]``, or the dataset's
batch method) into a sink (``sinks.py``: the task's slot, or the result
itself), timed less the waits for a CPU; and which stream of random
numbers a worker draws from."""

import os
import time

from chainiter import _context
from chainiter.iterators.pipeline.memory import converted, sinks
from chainiter.iterators.pipeline.flow import remote, tasks


class RunQueueClock:
    """Seconds this thread has waited for a CPU while it could run (Linux's
    ``/proc/thread-self/schedstat``; always 0 elsewhere).

    A worker reports the seconds a task took less these: on a machine
    with fewer cores than processes, the wall time of a task grows with
    the number of workers (each waits for its turn), and the pipeline,
    taking that for work, would keep more workers busy, which only makes
    the waits longer.  Waits for I/O still count, as work that more
    workers overlap.
    """

    def __init__(self):
        try:
            self._fd = os.open('/proc/thread-self/schedstat', os.O_RDONLY)
        except (OSError, AttributeError):
            self._fd = None

    def close(self):
        """Close its descriptor (a worker thread's, at its end)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __call__(self):
        if self._fd is None:
            return 0.0
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) * 1e-9
        except (OSError, ValueError, IndexError):
            return 0.0


def load(dataset, step, seed, sink, batched, capture):
    """``(metas, error)``: the examples of ``step`` written by ``sink``,
    or the error that loading them raised (``capture``: as a worker
    process or thread sends it home)."""
    try:
        _context.load_examples(dataset, step.indices, seed, step.spans, sink)
    except Exception as e:
        return [], capture(e, step.indices if batched else
                           int(step.indices[len(sink)]))
    return sink.result(), None


def run_task(dataset, converter, batched, task, whole, layout, run_queue,
             capture=remote.capture):
    """``(metas, error, seconds, queued)``: the task's examples loaded
    into ``whole`` (its slot, or None), as a worker process or thread
    runs it; ``seconds`` it took, less ``queued``, those it waited for a
    CPU."""
    started = time.perf_counter()
    queued = run_queue()
    if task.cuts:
        parts = []
        for a, b in tasks.segments(task):
            metas, error = load(dataset, task.step.cut(a, b), task.seed,
                                 sinks.sink_for(whole, layout,
                                                task.start + a), batched,
                                 capture)
            if error is not None:
                break
            parts.append(metas)
        metas = [] if error is not None else tasks.Parts(parts)
    else:
        metas, error = load(
            dataset, task.step, task.seed,
            sinks.sink_for(whole, layout, task.start) if converter is
            None else converted.ConverterSink(whole, layout, converter),
            batched, capture)
    queued = run_queue() - queued
    return metas, error, max(
        0.0, time.perf_counter() - started - queued), queued


def worker_stream(worker_id, num_workers, incarnation):
    """Which stream of the global RNGs a worker draws from: its id for the
    first worker of each id, ``worker_id + incarnation * num_workers`` for
    the one that replaces it the ``incarnation``-th time (after
    ``maxtasksperchild`` or a death), as if each replacement were a worker
    of its own in a pool that never replaces any: no two workers of a pool
    replay each other's numbers."""
    return worker_id + incarnation * num_workers
