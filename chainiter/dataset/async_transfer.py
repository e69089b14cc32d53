"""Host-to-GPU copies that overlap with the compute on the previous batch.

::

    host batch ──► in MultiprocessIterator's shared memory: page-locked
        │           (registered with CUDA) once, copied from directly
        └──────► else packed into a page-locked staging buffer
                     │ copies on a side stream ──► device arrays
                     └─ event "copied" ──► the compute stream waits on it when
                                           the batch is handed out

A staging buffer (``_staging.py``) holds one whole batch and is busy until
its "copied" event completes; at most ``STAGING_BUFFERS`` exist, and when
all are busy the next batch waits for the oldest copy, so page-locked
memory stays bounded however far the host runs ahead.  The page-locking of
shared memory is ``_pinning.py``.

The host batch is kept until its copy has completed, so that a
MultiprocessIterator does not refill that shared memory while it is read.
A handed-out batch is retired at the next hand-out: an event recorded on the
compute stream then marks the end of the compute that used it, and until
that event completes the transfer keeps the device arrays alive (so their
memory is not reused by the side stream).  Device
arrays the user keeps beyond the next batch and still uses are the user's:
cupy returns their memory to the side stream's pool when they are dropped.
"""

import collections
import warnings
import weakref
from typing import Any, Dict

import numpy

from chainiter.backends import cuda
from chainiter.backends import torch as torch_backend
from chainiter.backends._device import TorchDevice, parse_device
# STAGING_BUFFERS stays readable here, where it was.
from chainiter.dataset._pinning import pin
from chainiter.dataset._staging import (  # noqa: F401
    STAGING_BUFFERS, Staging)
from chainiter.dataset.convert import Converter, concat_examples, to_device
from chainiter.errors import SharedMemoryWarning

_ALIGN = 256            # bytes; where each array starts in a staging buffer


def _leaves(tree, found):
    """Append the numpy arrays of ``tree`` to ``found``, in order."""
    if isinstance(tree, (tuple, list)):
        for x in tree:
            _leaves(x, found)
    elif isinstance(tree, dict):
        for x in tree.values():
            _leaves(x, found)
    elif isinstance(tree, numpy.ndarray):
        found.append(tree)
    return found


def _replace_leaves(tree, new):
    """``tree`` with its numpy arrays replaced by ``next(new)``, in order."""
    if isinstance(tree, tuple):
        return tuple(_replace_leaves(x, new) for x in tree)
    if isinstance(tree, list):
        return [_replace_leaves(x, new) for x in tree]
    if isinstance(tree, dict):
        return {k: _replace_leaves(v, new) for k, v in tree.items()}
    if isinstance(tree, numpy.ndarray):
        return next(new)
    return tree


def _drain(stream, staging, copying, retired):
    stream.synchronize()
    for event, _ in retired:
        event.synchronize()
    retired.clear()
    for ticket in copying:
        ticket.keep = None
    copying.clear()
    staging.buffers.clear()


class Ticket:
    """A batch whose copy to the GPU has been issued."""

    def __init__(self, device_batch, copied, keep):
        self.batch = device_batch
        self.copied = copied     # event on the side stream
        self.keep = keep         # host objects the copy reads from


class AsyncTransfer:
    """Issues host-to-device copies on a side stream (see the module)."""

    def __init__(self, device_id, stream=None):
        self.device_id = device_id
        cuda.check_available(device_id)
        with cuda.device(device_id):
            self.stream = stream or cuda.new_stream()
        self._staging = Staging()
        self._copying = collections.deque()     # tickets still read from
        self._retired = collections.deque()
        self._handed_out = None
        self.copies = {'direct': 0, 'staged': 0}   # arrays, by path
        self._warned = False
        # Dropped or closed, it waits for its queued copies before their
        # sources (staging buffers, host batches) may be reused.
        self._finalizer = weakref.finalize(
            self, _drain, self.stream, self._staging, self._copying,
            self._retired)

    def close(self):
        """Wait for the copies issued, then let go of every host batch and
        staging buffer (the ticket handed out last stays valid)."""
        self._finalizer()

    def issue(self, host_batch):
        """Start copying ``host_batch`` (arrays, or tuples/lists/dicts of
        them) to the device; returns a ``Ticket``."""
        self.drop_copied()
        arrays = _leaves(host_batch, [])
        staged = []
        for array in arrays:
            pinned, error = pin(array, self.stream)
            staged.append(not pinned)
            if error is not None and not self._warned:
                self._warned = True
                warnings.warn(
                    'CUDA cannot page-lock the shared memory of a '
                    'MultiprocessIterator ({}: {}); such batches are copied '
                    'to the GPU through a staging buffer instead, which is '
                    'slower'.format(type(error).__name__, error),
                    SharedMemoryWarning, stacklevel=3)
        offsets, end = [], 0
        for array, stage in zip(arrays, staged):
            offsets.append(end)
            if stage:
                end += -(-array.nbytes // _ALIGN) * _ALIGN
        staging = self._staging.take(end) if any(staged) else None
        sources = []
        for array, stage, offset in zip(arrays, staged, offsets):
            if stage:
                source = staging.array[offset:offset + array.nbytes].view(
                    array.dtype).reshape(array.shape)
                numpy.copyto(source, array)
                array = source
            sources.append(array)
        with cuda.device(self.device_id):
            outs = [cuda.copy_to_device(a, self.stream) for a in sources]
            copied = self.stream.record()
        if staging is not None:
            staging.busy = copied
        self.copies['staged'] += sum(staged)
        self.copies['direct'] += len(staged) - sum(staged)
        ticket = Ticket(_replace_leaves(host_batch, iter(outs)), copied,
                        host_batch)
        self._copying.append(ticket)
        return ticket

    @property
    def staging_bytes(self):
        """Page-locked bytes held in staging buffers."""
        return sum(b.array.nbytes for b in self._staging.buffers
                   if b.array is not None)

    def drop_copied(self):
        """Let go of the host batches whose copies have completed (a
        MultiprocessIterator may then refill their shared memory)."""
        while self._copying and self._copying[0].copied.done:
            self._copying.popleft().keep = None

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


class TorchTransfer:
    """``AsyncTransfer`` for ``'@torch:cuda:N'``: each batch is packed into
    page-locked memory from torch's caching host allocator (which keeps it
    until the copy has run) and copied on a side stream; the compute stream
    waits for that copy when the batch is handed out, and the tensors are
    marked as used on it (``record_stream``), so that torch does not give
    their memory to the side stream while that compute runs.  The host
    batch is not read after ``issue``."""

    def __init__(self, index, stream=None):
        self.device = TorchDevice(index)
        torch_backend.check_available(index)
        self.stream = stream or torch_backend.new_stream(index)
        self.copies = {'direct': 0, 'staged': 0}     # arrays, by path

    def issue(self, host_batch):
        with torch_backend.on_stream(self.stream):
            batch = to_device(self.device, host_batch)
            copied = self.stream.record_event()
        self.copies['staged'] += len(_tensors(batch, []))
        return Ticket(batch, copied, None)

    def drop_copied(self):
        pass

    def hand_out(self, ticket):
        compute = torch_backend.current_stream(self.device.index)
        compute.wait_event(ticket.copied)
        for tensor in _tensors(ticket.batch, []):
            tensor.record_stream(compute)
        return ticket.batch

    def close(self):
        self.stream.synchronize()


def _tensors(tree, found):
    """Append the torch tensors of ``tree`` to ``found``, in order."""
    if isinstance(tree, (tuple, list)):
        for x in tree:
            _tensors(x, found)
    elif isinstance(tree, dict):
        for x in tree.values():
            _tensors(x, found)
    elif torch_backend.is_tensor(tree):
        found.append(tree)
    return found


def transfer_for(device_id, stream=None):
    """The asynchronous transfer to ``device_id`` (a GPU id, or a
    ``TorchDevice`` on a GPU)."""
    if isinstance(device_id, TorchDevice):
        return TorchTransfer(device_id.index, stream)
    return AsyncTransfer(device_id, stream)


class ConcatWithAsyncTransfer(Converter):
    """Chainer's ``ConcatWithAsyncTransfer``: ``concat_examples`` whose copy
    to the GPU runs on a side stream through page-locked memory, so that it
    overlaps with the kernels still running on the previous batch.

    On the host (``device`` None, -1 or ``'@numpy'``) and for
    ``'@torch'`` it is ``concat_examples``; ``'@torch:cuda:N'`` copies on
    a torch side stream (``TorchTransfer``).  Usable as
    ``converter(batch, device)``.
    """

    def __init__(self, stream: Any = None) -> None:
        self._stream = stream
        self._transfers: Dict[Any, Any] = {}

    def transfer_for(self, device_id):
        transfer = self._transfers.get(device_id)
        if transfer is None:
            transfer = self._transfers[device_id] = transfer_for(
                device_id, self._stream)
        return transfer

    def __call__(self, batch: Any, device: Any = None,
                 padding: Any = None) -> Any:
        device_id = parse_device(device)
        if device_id == TorchDevice(None):
            return concat_examples(batch, device, padding=padding)
        host = concat_examples(batch, padding=padding)
        if device_id is None:
            return host
        transfer = self.transfer_for(device_id)
        return transfer.hand_out(transfer.issue(host))
