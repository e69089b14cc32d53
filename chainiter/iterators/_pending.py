"""The queue of batches dispatched ahead of the user.

::

    DatasetIterator._dispatch_until ── append((state_after, handle)) ──►
        [ (state_after, handle), ... ]  ── popleft() ──► next() adopts
                                                          state_after

Each entry is the state after the batch and the transport's handle for it
(what ``_submit`` returned), or ``None`` for the end of the iteration
(``StopIteration``), or a ``Failed`` whose error the ``next()`` that would
return the batch raises.  Nothing follows either: the queue is then
``closed()``.  A transport reads the handles (``handles()``, ``handle(i)``)
and asks which were sent to it (``sent``); only the iterator changes the
queue.
"""

import collections


class Failed:
    """A pending batch whose indices could not be computed."""

    __slots__ = ('error',)

    def __init__(self, error):
        self.error = error


def sent(handle):
    """Whether ``handle`` is a transport's (not the end, not a failure)."""
    return handle is not None and not isinstance(handle, Failed)


class PendingBatches(collections.deque):
    """A deque of ``(state_after, handle)``, first to be handed out first,
    with the questions the iterator and its transport ask of it."""

    __slots__ = ()

    def closed(self):
        """Whether the end of the iteration, or an error, is queued: no
        batch may follow."""
        return bool(self) and not sent(self[-1][1])

    def handles(self):
        """The handles, first to last (a list: safe to keep while the
        queue changes)."""
        return [handle for _, handle in self]

    def handle(self, index):
        """The handle of the ``index``-th pending batch, or None where
        fewer are pending."""
        return self[index][1] if index < len(self) else None
