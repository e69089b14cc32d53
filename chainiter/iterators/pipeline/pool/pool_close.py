"""Closing the pool: its workers, the receiver thread and the slots, all
of it or nothing.

A part of ``Pool`` (``pool.py``), mixed into it: its method uses the
pool's state, as the table under "Threads" in ``__init__.py`` says.
"""

import os
import queue

from chainiter._interrupts import uninterrupted

# Put in the ready queue by close(): wakes a next() waiting in another thread.
CLOSED = object()


class PoolClose:
    """``Pool``'s shutdown."""

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
            self.ready.put(CLOSED)
            if self.receiver.is_alive():
                self.receiver.stop()
            # Batches read ahead view their slots: drop them, so that the
            # slots are unmapped now (and CLOSED goes back for any waiter).
            self._box.clear()
            while True:
                try:
                    self.ready.get_nowait()
                except queue.Empty:
                    break
            self.ready.put(CLOSED)
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
