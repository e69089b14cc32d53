"""DevicePrefetcher: batches arrive on the GPU, ``depth`` batches ahead."""

import collections
import copy
from typing import (
    Any, Callable, Deque, Dict, Mapping, Optional, Tuple)

from chainiter.backends import torch as torch_backend
from chainiter.backends._device import TorchDevice, parse_device
from chainiter.dataset.async_transfer import transfer_for
from chainiter.dataset.convert import concat_examples, to_device
from chainiter.iterators import _snapshot
from chainiter.iterators._protocol import Iterator
from chainiter.iterators._loop import EpochView

_ATTRIBUTES = ('epoch', 'current_position', 'is_new_epoch', 'epoch_detail',
               'previous_epoch_detail')


class DevicePrefetcher(Iterator):
    """Wraps a chainiter iterator: ``next()`` returns the batch converted
    and already copied to ``device``, while the copies of the next ``depth``
    batches run in the background.

    Args:
        iterator: a SerialIterator, MultithreadIterator or
            MultiprocessIterator.  With a MultiprocessIterator whose
            converter is ``concat_examples`` the copy reads its shared memory
            directly.
        device: a GPU (int id, ``'@cupy:N'``, cupy ``Device``), the host
            (None, -1, ``'@numpy'``), or torch tensors: ``'@torch'`` (CPU
            tensors sharing the batch's memory, shared memory included)
            or ``'@torch:cuda:N'`` (copied on a torch side stream).
        depth (int): batches converted ahead of the one handed out.
        converter: turns a list of examples into arrays on the host
            (default ``concat_examples``); not applied to batches the
            iterator already stacked.

    The epoch attributes and ``serialize()`` are those of the wrapped
    iterator as of the batch handed out: batches fetched ahead are not
    counted, so a snapshot resumes exactly.  ``len()`` and ``one_epoch()``
    are those of the wrapped iterator, the batches coming through this one;
    ``stats`` are the wrapped iterator's (the batches fetched ahead
    included).
    """

    def __init__(self, iterator: Any,
                 device: Any = None, depth: int = 2,
                 converter: Optional[Callable[..., Any]] = None) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or \
                depth < 0:
            raise ValueError('depth must be an int >= 0, got {!r}'.format(
                depth))
        self.iterator = iterator
        self.device = device
        self.depth = depth
        self._device_id = parse_device(device)
        self.converter = converter or concat_examples
        self._transfer = None
        if self._device_id == TorchDevice(None):
            torch_backend.check_available(None)
        elif self._device_id is not None:
            self._transfer = transfer_for(self._device_id)
        # (attributes, state, ticket)
        self._ahead: Deque[Tuple[Any, Any, Any]] = collections.deque()
        self._current: Optional[Tuple[Any, Any]] = None
        self._exhausted = False

    @property
    def copies(self) -> Optional[Dict[str, int]]:
        """How many arrays were copied to the GPU straight from
        MultiprocessIterator's shared memory (``'direct'``) and through a
        page-locked staging buffer (``'staged'``); None on the host and
        for ``'@torch'``."""
        return None if self._transfer is None else dict(self._transfer.copies)

    # ---- the protocol ----------------------------------------------------

    def __len__(self) -> int:
        return len(self.iterator)

    def __bool__(self) -> bool:
        return True

    def one_epoch(self, drop_last: bool = False) -> EpochView:
        """As the wrapped iterator's ``one_epoch()``, through this one."""
        return EpochView(self, drop_last)

    def loader(self, drop_last: bool = False) -> Any:
        """DataLoader's protocol through this one (:class:`chainiter.Loader`):
        each ``iter()`` an epoch of batches on the device."""
        from chainiter.iterators.loader import Loader
        return Loader(self, drop_last)

    def __next__(self) -> Any:
        self._fill(self.depth + 1)
        if not self._ahead:
            # The wrapped iterator stopped: its attributes (Chainer updates
            # previous_epoch_detail on this call) are the user's now.
            self._current = self._where()
            raise StopIteration
        attributes, state, ticket = self._ahead.popleft()
        self._current = (attributes, state)
        batch = ticket if self._transfer is None else \
            self._transfer.hand_out(ticket)
        self._fill(self.depth)
        return batch

    def _fill(self, count):
        while len(self._ahead) < count and not self._exhausted:
            if self._transfer is not None:
                self._transfer.drop_copied()
            try:
                batch = next(self.iterator)
            except StopIteration:
                self._exhausted = True
                return
            if getattr(self.iterator, 'converter', None) is None:
                batch = self.converter(batch)
            if self._transfer is not None:
                ticket = self._transfer.issue(batch)
            elif self._device_id == TorchDevice(None):
                ticket = to_device(self.device, batch)
            else:
                ticket = batch
            self._ahead.append(self._where() + (ticket,))

    def _where(self):
        """The wrapped iterator's attributes and state, as of now."""
        return ({name: getattr(self.iterator, name) for name in _ATTRIBUTES},
                self.iterator.state_dict())

    def _drop_ahead(self):
        self._ahead.clear()
        self._exhausted = False

    def reset(self) -> None:
        self.iterator.reset()
        self._drop_ahead()
        self._current = None

    def finalize(self) -> None:
        self._drop_ahead()
        if self._transfer is not None:
            self._transfer.close()    # before the iterator unmaps its slots
        self.iterator.finalize()

    def __getattr__(self, name: str) -> Any:
        if name in _ATTRIBUTES:
            current = self.__dict__.get('_current')
            if current is None:
                return getattr(self.iterator, name)
            return current[0][name]
        if name.startswith('_'):
            raise AttributeError(name)
        return getattr(self.iterator, name)

    # ---- copies and pickles ---------------------------------------------

    def __getstate__(self):
        # The wrapped iterator is ahead by the batches fetched ahead; the
        # copy is put back where this one's user stands.
        return {'iterator': self.iterator, 'state': self.state_dict(),
                'device': self.device, 'depth': self.depth,
                'converter': self.converter}

    def __setstate__(self, pickled):
        self.__init__(pickled['iterator'], pickled['device'],
                      pickled['depth'], pickled['converter'])
        self.load_state_dict(pickled['state'])

    def __copy__(self):
        pickled = self.__getstate__()
        pickled['iterator'] = copy.copy(self.iterator)
        new = type(self).__new__(type(self))
        new.__setstate__(pickled)
        return new

    # ---- snapshots -------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        if self._current is None:
            return self.iterator.state_dict()
        return dict(self._current[1])

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.iterator.load_state_dict(state_dict)
        self._drop_ahead()
        self._current = None

    def serialize(self, serializer: Any) -> None:
        if _snapshot.is_deserializer(serializer):
            self.iterator.serialize(serializer)
            self._drop_ahead()
            self._current = None
            return
        if self._current is None:
            self.iterator.serialize(serializer)
            return
        self.iterator._write_snapshot(serializer, self._current[1])
