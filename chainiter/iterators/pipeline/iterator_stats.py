"""What ``stats`` and ``diagnose`` (``_stats.py``) read of a
``MultiprocessIterator`` beyond ``_base.py``'s: the transport's keys of
``stats``, the batches ready, the timed window's start, and whether the
converter runs in the main process.

A part of ``MultiprocessIterator`` (``iterator.py``), mixed into it: its
members read the iterator's transport (``self._t``) and options.
"""

import time

from chainiter.iterators._pending import Failed
from chainiter.iterators.pipeline.flow import worker_stats


class IteratorStats:
    """``MultiprocessIterator``'s side of ``stats`` and ``diagnose``."""

    def _transport_stats(self, stats):
        """``stats`` (``_base.py``'s) with the transport's keys added."""
        stats['by_copy'] = self._t.by_copy
        stats['prefetch'] = self._t.depth
        stats['batches_per_task'] = self._t.groups.size
        pool = self._t.pool
        stats['workers_active'] = self._options.n_processes \
            if pool is None else pool.book.active
        main = None if pool is None else pool.main_tasks
        stats['loads_in'] = 'main thread' if main is not None and \
            main.on else 'workers'
        since = self._timing.since
        stats['worker_busy'], stats['worker_cpu_wait'] = \
            worker_stats.worker_busy(
                pool, self._t.busy_mark,
                None if since is None else time.perf_counter() - since,
                stats['workers_active'])
        return stats

    def _ready_batches(self):
        """The batches of the finished jobs that wait in the pool (a batch,
        or a group), and of the group taken ahead.  The pool hands jobs
        out in the order they were sent: the first ``n_ready()`` sent and
        not collected, a group counted once, as many batches as it has."""
        if self._t.pool is None:
            return 0
        return self._t.groups.ready(
            [None if isinstance(handle, Failed) else handle
             for _, handle in list(self._pending)], self._t.pool.n_ready())

    def _stats_window_started(self):
        self._t.busy_mark = worker_stats.window_mark(self._t.pool)

    @property
    def _pool(self):
        """The Pool: None until started, and once finalized."""
        return self._t.pool

    # What ``diagnose`` (``_stats.py``) asks: whether the converter runs
    # in the main process.
    @property
    def _stacked(self):
        return self._options.stacked

    @property
    def _in_workers(self):
        return self._options.in_workers
