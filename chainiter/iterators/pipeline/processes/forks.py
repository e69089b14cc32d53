"""What a fork of the main process (``os.fork()``, a fork ``Process``)
means for the pools in it.

In the child the workers are the parent's: multiprocessing must not count
them as the child's own.  In the parent, arrays handed out are now the
child's too: their slots are never written again.
"""

import os
import weakref

from chainiter._interrupts import uninterrupted

# Every pool of this process, so that a forked child can let go of them.
POOLS = weakref.WeakSet()


def _forget_workers_in_child():
    """After os.fork(): the workers are the parent's.  Take them off
    multiprocessing's list of this process's children, or its exit handler
    would terminate (daemonic) or try to join them in the child."""
    import multiprocessing.process
    children = getattr(multiprocessing.process, '_children', None)
    if children is None:
        return
    for pool in list(POOLS):
        for process in pool.launcher.processes():
            children.discard(process)


def _retire_leased_slots():
    """After a fork, in the parent: arrays handed out are now the child's
    too; their slots are never reused (the child reads what it got)."""
    for pool in list(POOLS):
        if pool.owner != os.getpid() or pool.closed:
            continue
        # Held back: a signal handler that raised between the acquire and
        # the try (a Ctrl-C, or a timeout's SIGALRM, in the next() that
        # forked a worker) would leave the lock held for good, and next()
        # and the receiver thread waiting for it.
        with uninterrupted():
            if pool.lock.acquire(timeout=10):
                try:
                    pool.slots.retire_leased()
                finally:
                    pool.lock.release()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_forget_workers_in_child,
                        after_in_parent=_retire_leased_slots)
