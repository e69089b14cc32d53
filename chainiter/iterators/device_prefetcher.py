"""DevicePrefetcher: batches arrive on the GPU, ``depth`` batches ahead.

::

    wrapped iterator ── next() ──► convert, issue the copy ──► _ahead:
        [(attributes, state, ticket or Failed), ...]  (state: the wrapped
        iterator's state after that batch)  ── next() hands out the first
        and adopts its attributes and state (_current)

Each batch is taken with the state after it, as the iterators' own
pending batches are, and the user's position is the state adopted last.
Whatever a ``next()`` raises, it leaves that position where it was and
every batch arrives once, in order:

- an error the wrapped iterator raises (an example that cannot be loaded),
  or the converter raises, is queued as a ``Failed`` and raised by the
  call that would have returned its batch, after the batches before it;
- after any exception (a Ctrl-C anywhere), the batches fetched ahead are
  kept where the wrapped iterator stands just after the last of them (the
  exception came while it loaded the next, which leaves it as it was);
  else it is put back at the user's position (``load_state_dict``) and
  they are fetched again.  ``_stale`` says that this is still to be done,
  should a second exception cut it short;
- the batch handed out is adopted by one store just before the return,
  where no signal handler runs; it leaves the queue at the next call.
"""

import collections
import copy
from typing import (
    Any, Callable, Deque, Dict, Mapping, Optional, Tuple)

import numpy

from chainiter.backends import torch as torch_backend
from chainiter.backends._device import TorchDevice, parse_device
from chainiter.dataset.async_transfer import transfer_for
from chainiter.dataset.convert import concat_examples, to_device
from chainiter.iterators import _snapshot
from chainiter.iterators._loop import EpochView
from chainiter.iterators._pending import Failed
from chainiter.iterators._protocol import Iterator

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
    counted, so a snapshot resumes exactly.  As for every iterator, a
    ``next()`` that raises (a Ctrl-C, an example that cannot be loaded, a
    converter's error) leaves the position where it was, and the batches
    before an error arrive first.  ``len()`` and ``one_epoch()``
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
        # (attributes, state, ticket or Failed); the first may be the batch
        # handed out last (_settle drops it).
        self._ahead: Deque[Tuple[Any, Any, Any]] = collections.deque()
        # (attributes, state) as of the batch handed out; None: the wrapped
        # iterator stands where the user does, with nothing fetched ahead.
        self._current: Optional[Tuple[Any, Any]] = None
        self._exhausted = False
        self._stale = False     # the wrapped iterator must be put back

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
        self._settle()
        if self._stale:
            self._rewind()
        if self._current is None:
            self._current = self._where()
        try:
            self._fill(self.depth + 1)
            if not self._ahead:
                # The wrapped iterator stopped: its attributes (Chainer
                # updates previous_epoch_detail on this call) are the
                # user's now.
                self._current = self._where()
                raise StopIteration
            attributes, state, ticket = self._ahead[0]
            if isinstance(ticket, Failed):
                self._ahead.popleft()
                raise ticket.error
            batch = ticket if self._transfer is None else \
                self._transfer.hand_out(ticket)
        except StopIteration:
            raise
        except BaseException:
            self._stale = True
            self._recover()
            raise
        # Nothing between here and the return lets a signal handler run, so
        # a KeyboardInterrupt cannot consume the batch without delivering it.
        self._current = (attributes, state)
        return batch

    def _settle(self):
        """Drop the batch handed out last from the queue."""
        if self._ahead and self._current is not None and \
                self._ahead[0][1] is self._current[1]:
            self._ahead.popleft()

    def _fill(self, count):
        """Fetch batches ahead until ``count`` are queued, the wrapped
        iterator stops, or a batch fails (nothing is fetched past it)."""
        while len(self._ahead) < count and not self._exhausted and not (
                self._ahead and isinstance(self._ahead[-1][2], Failed)):
            if self._transfer is not None:
                self._transfer.drop_copied()
            try:
                batch = next(self.iterator)
            except StopIteration:
                self._exhausted = True
                return
            except Exception as e:
                # Raised by the call that would return this batch, after
                # the batches before it; the wrapped iterator stays put.
                self._ahead.append(self._where() + (Failed(e),))
                return
            where = self._where()
            try:
                ticket = self._ticket(batch)
            except Exception as e:
                self._ahead.append(where + (Failed(e),))
                return
            self._ahead.append(where + (ticket,))

    def _ticket(self, batch):
        """``batch`` converted, its copy to the device issued."""
        if getattr(self.iterator, 'converter', None) is None:
            batch = self.converter(batch)
        if self._transfer is not None:
            return self._transfer.issue(batch)
        if self._device_id == TorchDevice(None):
            return to_device(self.device, batch)
        return batch

    def _where(self):
        """The wrapped iterator's attributes and state, as of now."""
        return ({name: getattr(self.iterator, name) for name in _ATTRIBUTES},
                self.iterator.state_dict())

    def _recover(self):
        """After an exception in ``next()`` (``_stale`` set): keep the
        batches fetched ahead if the wrapped iterator stands just after the
        last of them, else put it back at the user's position."""
        self._settle()
        last = self._ahead[-1][1] if self._ahead else self._current[1]
        if same_state(self.iterator.state_dict(), last):
            self._stale = False
        else:
            self._rewind()

    def _rewind(self):
        """Put the wrapped iterator back at the user's position and drop
        the batches fetched ahead."""
        if self._current is not None:
            self.iterator.load_state_dict(self._current[1])
        self._drop_ahead()
        self._stale = False

    def _drop_ahead(self):
        self._ahead.clear()
        self._exhausted = False

    def reset(self) -> None:
        # Cut short, it is undone by the next call.
        self._stale = True
        self.iterator.reset()
        self._forget()

    def _forget(self):
        """The wrapped iterator stands where the user does now."""
        self._drop_ahead()
        self._current = None
        self._stale = False

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
        # A load that fails leaves the wrapped iterator as it was; cut
        # short, it is undone by the next call.
        self._stale = True
        self.iterator.load_state_dict(state_dict)
        self._forget()

    def serialize(self, serializer: Any) -> None:
        if _snapshot.is_deserializer(serializer):
            self._stale = True
            self.iterator.serialize(serializer)
            self._forget()
            return
        if self._current is None:
            self.iterator.serialize(serializer)
            return
        self.iterator._write_snapshot(serializer, self._current[1])


def same_state(a, b):
    """Whether two state dicts are equal, key for key and value for
    value."""
    return a.keys() == b.keys() and all(
        numpy.array_equal(a[key], b[key]) for key in a)
