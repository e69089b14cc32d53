"""Host-to-GPU copies that overlap with the compute on the previous batch.

::

    host batch ──► (shared memory of MultiprocessIterator: page-locked once,
        │            copied from directly)
        └──────► or a page-locked staging buffer (double buffered)
                     │ copy on a side stream ──► device arrays
                     └─ event "copied" ──► the compute stream waits on it when
                                           the batch is handed out

A handed-out batch is retired at the next hand-out: an event recorded on the
compute stream then marks the end of the compute that used it, and until
that event completes the transfer keeps the device arrays (so their memory
is not reused by the side stream) and the host arrays it copied from (so a
MultiprocessIterator does not refill that shared memory, and a staging
buffer is not overwritten) alive.
"""

import collections
import ctypes

import numpy

from chainiter.backends import cuda
from chainiter.backends._device import parse_device
from chainiter.dataset.convert import Converter, concat_examples


def _map_arrays(fn, tree):
    if isinstance(tree, tuple):
        return tuple(_map_arrays(fn, x) for x in tree)
    if isinstance(tree, list):
        return [_map_arrays(fn, x) for x in tree]
    if isinstance(tree, dict):
        return {k: _map_arrays(fn, v) for k, v in tree.items()}
    if isinstance(tree, numpy.ndarray):
        return fn(tree)
    return tree


def shared_region(array):
    """``(address, nbytes)`` of the whole shared-memory buffer ``array``
    views when it was handed out by a MultiprocessIterator, else None."""
    base = array
    while isinstance(base, numpy.ndarray):
        base = base.base
    if not isinstance(base, ctypes.Array):
        return None
    for owner in (getattr(base, '_objects', None) or {}).values():
        mapped = getattr(owner, 'obj', None)     # memoryview of the mmap
        if mapped is not None:
            whole = (ctypes.c_char * len(mapped)).from_buffer(mapped)
            return ctypes.addressof(whole), len(mapped)
    return None


class Ticket:
    """A batch whose copy to the GPU has been issued."""

    def __init__(self, device_batch, copied, keep):
        self.batch = device_batch
        self.copied = copied     # event on the side stream, or None
        self.keep = keep         # host objects the copy reads from


class AsyncTransfer:
    """Issues host-to-device copies on a side stream (see the module)."""

    def __init__(self, device_id, stream=None):
        self.device_id = device_id
        cuda.check_available(device_id)
        with cuda.device(device_id):
            self.stream = stream or cuda.new_stream()
        self._staging = []                  # [pinned array, busy event]
        self._retired = collections.deque()
        self._handed_out = None

    def _staging_for(self, nbytes):
        for entry in self._staging:
            array, busy = entry
            if array.nbytes >= nbytes and (busy is None or busy.done):
                return entry
        entry = [cuda.alloc_pinned(max(nbytes, 1)), None]
        self._staging.append(entry)
        return entry

    def issue(self, host_batch):
        """Start copying ``host_batch`` (arrays, or tuples/lists/dicts of
        them) to the device; returns a ``Ticket``."""
        keep = [host_batch]
        used = []

        def copy(array):
            region = shared_region(array)
            if region is not None and array.flags.c_contiguous:
                cuda.register_host(*region)
                source = array
            else:
                entry = self._staging_for(array.nbytes)
                used.append(entry)
                source = entry[0][:array.nbytes].view(array.dtype).reshape(
                    array.shape)
                numpy.copyto(source, array)
                keep.append(entry)
            return cuda.copy_to_device(source, self.stream)

        with cuda.device(self.device_id):
            device_batch = _map_arrays(copy, host_batch)
            copied = self.stream.record()
        for entry in used:
            entry[1] = copied
        return Ticket(device_batch, copied, keep)

    def hand_out(self, ticket):
        """The ticket's device batch, made safe to use on the current
        stream; retires the batch handed out before."""
        with cuda.device(self.device_id):
            compute = cuda.current_stream()
            if self._handed_out is not None:
                self._retired.append((compute.record(), self._handed_out))
            while self._retired and self._retired[0][0].done:
                self._retired.popleft()
            compute.wait_event(ticket.copied)
        self._handed_out = ticket
        return ticket.batch


class ConcatWithAsyncTransfer(Converter):
    """Chainer's ``ConcatWithAsyncTransfer``: ``concat_examples`` whose copy
    to the GPU runs on a side stream through page-locked memory, so that it
    overlaps with the kernels still running on the previous batch.

    On the host (``device`` None, -1 or ``'@numpy'``) it is
    ``concat_examples``.  Usable as ``converter(batch, device)``.
    """

    def __init__(self, stream=None):
        self._stream = stream
        self._transfers = {}

    def transfer_for(self, device_id):
        transfer = self._transfers.get(device_id)
        if transfer is None:
            transfer = self._transfers[device_id] = AsyncTransfer(
                device_id, self._stream)
        return transfer

    def __call__(self, batch, device=None, padding=None):
        device_id = parse_device(device)
        host = concat_examples(batch, padding=padding)
        if device_id is None:
            return host
        transfer = self.transfer_for(device_id)
        return transfer.hand_out(transfer.issue(host))
