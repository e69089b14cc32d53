"""Page-locking MultiprocessIterator's shared memory for copies to the
GPU: ``pin`` registers a slot's buffer with CUDA the first time a batch is
copied from it, and unregisters it when the iterator releases the buffer;
``shared_region`` tells the buffer an array views."""

import os
import threading
import warnings
from typing import Any, Dict

from chainiter.backends import cuda


def _shared_buffer(array):
    # Imported here: chainiter.iterators imports this module.
    from chainiter.iterators.pipeline.memory.shm import SharedBuffer
    return SharedBuffer.of(array)


def shared_region(array):
    """``(address, nbytes)`` of the whole shared-memory buffer ``array``
    views when it was handed out by a MultiprocessIterator, else None."""
    shared = _shared_buffer(array)
    return None if shared is None else shared.region()


# A slot's buffer is registered with CUDA the first time a batch is copied
# from it, and unregistered when the iterator releases the buffer, after
# the streams that copied from it are synchronised: registrations never
# outlive the mapping (a later mapping at the same address would otherwise
# be copied through the stale one), and nothing stays page-locked after
# finalize().

# SharedBuffer -> streams that copied from it, or None
_pins: Dict[Any, Any] = {}
# Re-entrant: garbage collection while it is held may finalize an iterator,
# whose release() unpins on the same thread.
_pins_lock = threading.RLock()


def pin(array, stream):
    """``(pinned, error)``: whether ``array`` lies in shared memory that is
    page-locked now, so the copy can read it directly on ``stream``, and
    the CUDA error if registering that memory failed just now."""
    if not array.flags.c_contiguous:
        return False, None
    shared = _shared_buffer(array)
    if shared is None:
        return False, None
    error = None
    with _pins_lock:
        if shared not in _pins:
            region = shared.region()
            if region is None:                  # released meanwhile
                return False, None
            address, nbytes = region
            error = cuda.register_host(address, nbytes)
            _pins[shared] = None if error else []
            pid = os.getpid()
            if not shared.when_released(
                    lambda: _unpin(shared, address, pid)):
                _unpin(shared, address, pid)    # released by another thread
                return False, None
        streams = _pins.get(shared)
        if streams is None:
            return False, error
        if stream not in streams:
            streams.append(stream)
        return True, None


def _unpin(shared, address, pid):
    with _pins_lock:
        streams = _pins.pop(shared, None)
    if streams is None or os.getpid() != pid:   # not pinned, or forked
        return
    try:
        try:
            for stream in streams:   # copies that may still read the memory
                stream.synchronize()
        finally:
            cuda.unregister_host(address)
    except Exception as e:
        warnings.warn('could not unregister page-locked shared memory from '
                      'CUDA: {}: {}'.format(type(e).__name__, e),
                      RuntimeWarning, stacklevel=2)
