"""The pool's finished batches, in order: the ready queue that the
receiver thread fills (``_put_ready``, reading a group's batches ahead)
and the main thread's ``next()`` takes from (``Pool.wait``, in
``pool.py`` with the rest of what the main thread calls, and ``take``),
and the warnings kept for the main thread.

A part of ``Pool`` (``pool.py``), mixed into it: its methods use the
pool's state, as the table under "Threads" in ``__init__.py`` says.
"""

import queue
import time
import warnings

import numpy

from chainiter.iterators.pipeline.memory import read
from chainiter.iterators.pipeline.flow import tasks
from chainiter.iterators.pipeline.flow.book import Batch


class ReadyBatches:
    """``Pool``'s side of the ready queue (``self.ready``, with
    ``self._box``: what ``wait`` or ``take`` got from it and has not
    handed out or dropped yet)."""

    def n_ready(self):
        """The finished batches that wait in order for ``wait`` (main
        thread)."""
        return self.ready.qsize() + len(self._box)

    def interrupted_waiting(self):
        """Whether the exception going up from ``wait`` (a Ctrl-C) came
        while it blocked with nothing taken: every batch in flight or
        ready is then where it was, for the next ``wait``.  Asked once
        (main thread)."""
        waiting, self.waiting = self.waiting, False
        return waiting

    def take(self, handle):
        """The finished batch of ``handle`` when it is the next ready and
        was read ahead (``_read_ahead``), else None, without waiting:
        whatever else is next stays for ``wait``.  The iterator takes a
        group's batch so while it hands out the group before, to spread
        its bookkeeping over the ``next()`` calls.  (Main thread, without
        the lock, as ``wait``.)"""
        if self.closed:
            return None
        box = self._box
        if not box:
            try:
                box.append(self.ready.get_nowait())
            except queue.Empty:
                return None
        batch = box[0]
        if type(batch) is not Batch or batch.prepared is None or \
                batch.seq != handle[1] or batch.generation != handle[0]:
            return None
        box.clear()
        self.receiver.consumed()
        self.book.handed_out(False, time.perf_counter(), len(batch.step))
        return batch

    def raise_events(self):
        """Raise the warnings the pool kept (main thread; takes the lock
        only when some wait)."""
        if not self.events:
            return
        with self.lock:
            events, self.events = self.events, []
        for category, message in events:
            warnings.warn(message, category, stacklevel=5)

    def _drop_ready(self):
        """Drop the finished batches waiting for ``wait`` (all of earlier
        generations now): those read ahead hold their slots while they
        are referenced.  What else waits there (an error,
        ``pool_close.CLOSED``) stays.  (Main thread, under the lock.)"""
        kept = [item for item in self._box if type(item) is not Batch]
        self._box.clear()
        while True:
            try:
                item = self.ready.get_nowait()
            except queue.Empty:
                break
            if type(item) is not Batch:
                kept.append(item)
        for item in kept:
            self.ready.put(item)

    def _put_ready(self, batches):
        """Queue finished batches for ``wait`` (under the lock: the
        receiver thread, or the main thread for a batch that fails as it
        is submitted)."""
        for batch in batches:
            if self.read_ahead:
                self._read_ahead(batch)
            self.ready.put(batch)

    def _read_ahead(self, batch):
        """Read the stacked arrays of a finished batch now (in the
        receiver thread, while the main thread trains), for ``hand_out``
        and the iterator to take as they are (``batch.prepared``): the
        ``next()`` that takes a group's first batch then does no more than
        the others.  Only the common case: every chunk loaded, every
        example in its rows, one array per field.  The slot holds the
        exporter now, and is the batch's until ``hand_out``: it is free
        again once the arrays are gone and the batch is handed out or of
        an earlier generation (``new_generation`` drops those waiting).
        Under the lock, as ``_put_ready``."""
        if batch.failure is not None or batch.slot is None or \
                batch.buffers.layout.mode != 'stacked':
            return
        results = [batch.results[i] for i in range(batch.n_chunks)]
        if any(result.error is not None for result in results):
            return
        chunks = tasks.segment_metas([result.metas for result in results])
        try:
            exporter = self.slots.exporter(batch)
            stacked, _, oversize = read.read_batch(
                numpy.frombuffer(exporter, dtype=numpy.uint8),
                batch.buffers.layout, chunks, batch.cuts)
        except Exception:
            return      # the main thread reads it, and raises what it may
        if stacked is not None and not oversize:
            batch.prepared = (exporter, stacked)
            self.slots.view(batch.slot, exporter)
