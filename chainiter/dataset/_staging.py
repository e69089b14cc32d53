"""The page-locked buffers that batches not in shared memory are copied
through on their way to the GPU (``Staging``): page-locked memory stays
bounded however far the host runs ahead."""

from chainiter.backends import cuda

STAGING_BUFFERS = 4     # batches whose staged copy may be in flight at once


class StagingBuffer:
    __slots__ = ('array', 'busy', 'used')

    def __init__(self):
        self.array = None       # page-locked uint8 array
        self.busy = None        # event after the copies that read it
        self.used = 0           # when it was last given out

    def free(self):
        return self.busy is None or self.busy.done


class Staging:
    """Page-locked buffers that batches not in shared memory are copied
    through: one whole batch per buffer, busy until the event recorded
    after its copies, at most ``STAGING_BUFFERS`` of them."""

    def __init__(self):
        self.buffers = []
        self.count = 0

    def take(self, nbytes):
        """A buffer of at least ``nbytes`` that no queued copy reads; the
        caller sets its ``busy`` event once the copies are issued."""
        free = [b for b in self.buffers if b.free()]
        fitting = [b for b in free if b.array.nbytes >= nbytes]
        if fitting:
            buffer = fitting[0]
        elif len(self.buffers) < STAGING_BUFFERS:
            buffer = StagingBuffer()
            buffer.array = cuda.alloc_pinned(max(nbytes, 1))
            self.buffers.append(buffer)
        elif free:
            buffer = free[0]
        else:                   # all in flight: wait for the oldest
            buffer = min(self.buffers, key=lambda b: b.used)
            buffer.busy.synchronize()
        if buffer.array is None or buffer.array.nbytes < nbytes:
            array = cuda.alloc_pinned(max(nbytes, 1))
            buffer.array = array    # the old one returns to cupy's pool
        self.count += 1
        buffer.used = self.count
        buffer.busy = None
        return buffer
