"""A reorder buffer: items arrive in any order, leave in sequence order."""


class Reorderer:
    """``push(seq, item)`` stores an item and returns the items that are now
    ready, in order: those with the next expected sequence numbers.

    It is a dict and a counter, and knows nothing about threads.
    """

    def __init__(self, next_seq=0):
        self.reset(next_seq)

    def reset(self, next_seq):
        """Forget every stored item; expect ``next_seq`` next."""
        self._waiting = {}
        self._next = next_seq

    @property
    def next_seq(self):
        return self._next

    def push(self, seq, item):
        if seq < self._next or seq in self._waiting:
            raise ValueError('sequence number {} was already pushed'.format(
                seq))
        self._waiting[seq] = item
        ready = []
        while self._next in self._waiting:
            ready.append(self._waiting.pop(self._next))
            self._next += 1
        return ready

    def __len__(self):
        return len(self._waiting)
