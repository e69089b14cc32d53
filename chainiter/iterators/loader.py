"""``Loader``: DataLoader's protocol over a chainiter iterator, for the
training frameworks that take a DataLoader.

::

    framework ── iter(loader) ──► it.one_epoch() ── next(it) ... ──► batches
              ── len(loader) ──► epoch_batches(it)      (pure: _loop.py)
              ── loader.state_dict() ──► it.state_dict()

A loader holds no position of its own: the iterator's state is the whole
of it, so a checkpoint of the loader is the iterator's snapshot and loads
into a fresh loader (or a bare iterator) of any kind.
"""

from typing import Any, Dict, Mapping, Optional, Type

from chainiter.iterators import _loop
from chainiter.iterators._loop import EpochView


class Loader:
    """A re-iterable loader over a chainiter iterator, with DataLoader's
    protocol: each ``iter(loader)`` yields one of the iterator's epochs
    (``iterator.one_epoch()``), ``len(loader)`` is that epoch's number of
    batches, and ``state_dict()`` / ``load_state_dict()`` are the
    iterator's.  Made by ``it.loader()`` or ``chainiter.Loader(it)``.

    - ``iter()`` yields the batches whose first example lies in the epoch
      at hand, from the iterator's position on: a whole epoch when the last
      one ended, the rest of it after a resume mid-epoch.  With
      ``repeat=True`` the last batch is filled up from the next epoch, as
      ``next()`` gives it, and the next ``iter()`` starts where it stopped;
      with ``repeat=False`` an ``iter()`` once the pass has ended resets the
      iterator and yields a new pass (a new order).
    - ``len()`` is the number of batches of the epoch at hand, counted from
      its first batch, the ones already handed out included (a framework
      that resumes mid-epoch counts those itself).  With ``repeat=False``
      every pass has ``ceil(epoch_size / batch_size)`` batches (fewer by
      the short one with ``drop_last``).  With ``repeat=True`` an epoch
      entered at position ``p`` (the previous epoch's last batch took its
      ``p`` first examples) has ``ceil((epoch_size - p) / batch_size)``:
      ``len(it)`` or one fewer.  A sharded iterator counts its global
      steps, the same on every rank.
    - ``state_dict()`` taken after a batch of an epoch resumes on the next
      batch; taken after the epoch's last batch, on the next epoch.
    - ``finalize()`` and ``with`` finalize the iterator.

    Args:
        iterator: a SerialIterator, MultithreadIterator,
            MultiprocessIterator (sharded or not) or DevicePrefetcher.
        drop_last (bool): with ``repeat=False``, the last batch of a pass,
            when short, is consumed but not yielded (DataLoader's
            ``drop_last=True``); with ``repeat=True`` every batch is full
            and it changes nothing.
    """

    def __init__(self, iterator: Any, drop_last: bool = False) -> None:
        if isinstance(iterator, Loader):
            iterator = iterator.iterator
        for name in ('one_epoch', 'state_dict', 'load_state_dict',
                     'current_position', 'epoch_size', 'repeat'):
            if not hasattr(iterator, name):
                raise TypeError(
                    'Loader takes a chainiter iterator (SerialIterator, '
                    'MultithreadIterator, MultiprocessIterator or '
                    'DevicePrefetcher), got {!r}, which has no {}'.format(
                        iterator, name))
        self.iterator: Any = iterator
        self.drop_last = bool(drop_last)

    # ---- DataLoader's protocol -------------------------------------------

    def __iter__(self) -> EpochView:
        return self.iterator.one_epoch(self.drop_last)

    def __len__(self) -> int:
        return _loop.epoch_batches(self.iterator, self.drop_last)

    def __bool__(self) -> bool:
        return True     # a loader is true even for an empty dataset

    @property
    def batches_left(self) -> int:
        """The batches the next ``iter()`` yields: ``len()`` less those of
        the epoch at hand already handed out."""
        return _loop.batches_left(self.iterator, self.drop_last)

    @property
    def dataset(self) -> Any:
        return self.iterator.dataset

    @property
    def batch_size(self) -> int:
        return self.iterator.batch_size

    @property
    def epoch(self) -> int:
        """The iterator's ``epoch``."""
        return self.iterator.epoch

    # ---- snapshots -------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The iterator's ``state_dict()`` (a flat dict of ints and numpy
        arrays)."""
        return self.iterator.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """The iterator's ``load_state_dict()``: the next ``iter()`` goes on
        with the batch after the snapshot's."""
        self.iterator.load_state_dict(state_dict)

    def serialize(self, serializer: Any) -> None:
        """The iterator's ``serialize()`` (``save_npz``, ``load_npz``)."""
        self.iterator.serialize(serializer)

    # ---- the iterator's life ---------------------------------------------

    def finalize(self) -> None:
        self.iterator.finalize()

    def __enter__(self) -> 'Loader':
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc_value: Optional[BaseException],
                 traceback: Any) -> None:
        self.finalize()

    def __repr__(self) -> str:
        return '<Loader over {}: epoch {}, {} batches>'.format(
            type(self.iterator).__name__, self.iterator.epoch, len(self))
