"""The PyTorch-style loop over a Chainer-style iterator: ``len(it)``,
``it.one_epoch()`` and ``it.loader()`` (``loader.py``: DataLoader's
protocol, an epoch per ``iter()``).

::

    for epoch in range(10):
        for batch in it.one_epoch():       # stops at the epoch's end
            ...                            # snapshots inside resume exactly

``next(it)`` keeps Chainer's semantics (with ``repeat=True`` it never stops,
and the last batch of an epoch is filled up from the next epoch); the view
only decides when to stop calling it.  A view yields the batches whose first
example lies in the epoch it started in: with ``repeat=True`` it ends after
the batch on which ``is_new_epoch`` is True, so consecutive views hand out
the same stream as ``next()`` and cover every example once per epoch.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chainiter.iterators.loader import Loader


def _step(iterator):
    """Examples an iterator's position moves by per batch: the global batch
    of a sharded iterator (each rank gets its share of it)."""
    return getattr(iterator, 'global_batch_size', iterator.batch_size)


def _batches(examples, batch_size, drop_last):
    if drop_last:
        return examples // batch_size
    return -(-examples // batch_size)


def epoch_batches(iterator: Any, drop_last: bool = False) -> int:
    """The number of batches of the epoch at hand, the ones already handed
    out included: the epoch ``one_epoch()`` would yield the rest of (a new
    pass once a ``repeat=False`` pass has ended).  Pure: nothing is loaded
    or reset.

    An epoch of ``repeat=True`` is entered at a position ``p`` below one
    step (Chainer's last batch of the previous epoch took the ``p`` first
    examples), and each batch moves the position by a step, so mid-epoch
    ``current_position % step`` is ``p`` and the epoch has
    ``ceil((epoch_size - p) / step)`` batches starting in it.  A
    ``repeat=False`` pass starts at 0.
    """
    step = _step(iterator)
    drop_last = bool(drop_last) and not iterator.repeat
    if not iterator.repeat and iterator.epoch > 0:
        return _batches(iterator.epoch_size, step, drop_last)
    entered = iterator.current_position % step
    return _batches(iterator.epoch_size - entered, step, drop_last)


def batches_left(iterator: Any, drop_last: bool = False) -> int:
    """The batches ``one_epoch()`` would yield now (``epoch_batches`` less
    the ones of the epoch already handed out).  Pure, as
    ``epoch_batches``."""
    step = _step(iterator)
    drop_last = bool(drop_last) and not iterator.repeat
    if not iterator.repeat and iterator.epoch > 0:
        return _batches(iterator.epoch_size, step, drop_last)
    return _batches(iterator.epoch_size - iterator.current_position, step,
                    drop_last)


class EpochView:
    """The batches of one epoch, from the iterator's current position on.

    Made by ``iterator.one_epoch()``.  ``len(view)`` is how many batches it
    yields in all (tqdm shows it as the total); it is fixed when the view is
    made.  Each batch is ``next(iterator)``: the iterator's attributes and
    snapshots are those of the batch just yielded.
    """

    def __init__(self, iterator: Any, drop_last: bool = False) -> None:
        self.iterator = iterator
        if not iterator.repeat and iterator.epoch > 0:
            iterator.reset()      # a finished pass: a new one, as iter(loader)
        # With repeat=True every batch is full (Chainer's wrap-around).
        self.drop_last = bool(drop_last) and not iterator.repeat
        self._epoch = iterator.epoch
        left = iterator.epoch_size - iterator.current_position
        self._len = _batches(left, _step(iterator), self.drop_last)
        self._done = False

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> 'EpochView':
        return self

    def __next__(self) -> Any:
        it = self.iterator
        if self._done or it.epoch != self._epoch:
            self._done = True
            raise StopIteration
        if self.drop_last and \
                0 < it.epoch_size - it.current_position < _step(it):
            next(it)     # the short last batch: consumed, not yielded
            self._done = True
            raise StopIteration
        try:
            return next(it)
        except StopIteration:    # an empty dataset with repeat=False
            self._done = True
            raise

    def __repr__(self):
        return '<EpochView of epoch {} of {}: {} batches>'.format(
            self._epoch, type(self.iterator).__name__, self._len)


class EpochLoop:
    """What ``DatasetIterator`` gets for the PyTorch-style loop."""

    def __len__(self) -> int:
        """Batches per epoch: ``ceil(epoch_size / batch_size)``, as
        DataLoader's ``len`` with ``drop_last=False``.

        With ``repeat=False`` it is the number of batches of a pass.  With
        ``repeat=True`` it is the number of batches that start in an epoch
        entered at position 0; an epoch entered later (the previous one's
        last batch took its first examples) has that many or one fewer.
        ``len(it.one_epoch())`` is exact for the epoch at hand.  A sharded
        iterator counts its steps: ``ceil(epoch_size / global_batch_size)``,
        the same on every rank.
        """
        return _batches(self.epoch_size,  # type: ignore[attr-defined]
                        _step(self), False)

    def __bool__(self) -> bool:
        return True    # an iterator is true even for an empty dataset

    def one_epoch(self, drop_last: bool = False) -> EpochView:
        """The batches of the current epoch, for a PyTorch-style loop:
        ``for batch in it.one_epoch(): ...``.

        Mid-epoch (after a resume, say) it yields the rest of the epoch.
        With ``repeat=True`` it stops after the batch on which
        ``is_new_epoch`` is True (its last examples are the next epoch's
        first, as with ``next()``); the next view starts where it stopped.
        With ``repeat=False`` it yields the pass, the last batch short; a
        view made once the pass has ended calls ``reset()`` and yields a
        new pass, as iterating over a DataLoader again does.

        Args:
            drop_last (bool): with ``repeat=False``, do not yield the last
                batch when it is short (it is consumed all the same).  With
                ``repeat=True`` every batch is full, so it changes nothing.
        """
        return EpochView(self, drop_last)

    def loader(self, drop_last: bool = False) -> 'Loader':
        """DataLoader's protocol over this iterator, for the frameworks
        that take a DataLoader (Lightning, Accelerate): each ``iter()`` is
        ``one_epoch()``, ``len()`` the batches of the epoch at hand, and
        ``state_dict()`` / ``load_state_dict()`` the iterator's.  See
        :class:`chainiter.Loader`."""
        from chainiter.iterators.loader import Loader
        return Loader(self, drop_last)
