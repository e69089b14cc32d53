"""The process boundary as the pool sees it: the launcher of worker
processes (a fork launcher, or one process per worker under spawn and
forkserver, with the dataset pickled once and its large arrays shared),
the receiver thread, and the pool's handle on each worker."""

from chainiter.iterators.pipeline.processes import forks, receiver, share
from chainiter.iterators.pipeline.processes.launch import (
    ForkLauncher, ProcessLauncher)
from chainiter.iterators.pipeline.processes.worker_handle import Worker


class Processes:
    """Worker processes of a ``multiprocessing`` context."""

    handle = Worker

    def __init__(self, ctx):
        self.ctx = ctx
        self.method = ctx.get_start_method()

    def connect(self, pool, dataset, seed, n_workers, worker_init_fn,
                max_tasks):
        """Give ``pool`` its launcher, receiver and shared arrays (while
        the pool is built, before any worker starts)."""
        if self.method == 'fork':
            # Forked now, while this pool has no thread of its own.
            pool.launcher = ForkLauncher(self.ctx, (
                dataset, seed, n_workers, worker_init_fn, max_tasks))
        else:
            # The worker_init_fn travels in the dataset's pickle: what a
            # notebook defines goes by value, and a worker_init_fn that sets
            # a global the dataset reads must set the dataset's copy of it.
            # Pickled once, at the first start: every worker, a replacement
            # too, gets the same bytes (share.py).
            pool.shared_arrays = share.ArrayShare((dataset, worker_init_fn))
            pool.launcher = ProcessLauncher(self.ctx, (
                share.Shipped(pool.shared_arrays), seed, n_workers, None,
                max_tasks))
        forks.POOLS.add(pool)
        pool.receiver = receiver.Receiver(pool)
