"""Keras 3's ``model.fit`` over a chainiter iterator: ``KerasDataset``, a
``keras.utils.PyDataset`` whose Keras epochs are the iterator's epochs.

Importing this module imports keras (the only module of chainiter that
does; ``import chainiter`` never does).

::

    model.fit ── num_batches ──► batches_left(it)   (read once per fit)
              ── ds[i] ──► next(it.one_epoch())     (any i: the next batch)
              ── on_epoch_end ──► the next ds[0] starts the next epoch

Keras reads the number of batches once, when ``fit`` starts, and uses it
for every epoch of that fit, so one fit runs epochs of one length
(``repeat=False``, or ``repeat=True`` with an epoch size that is a multiple
of the batch size); otherwise a fit per epoch.  A fit resumed mid-epoch
finishes that epoch alone (``resumed_mid_epoch``); a fit that would go on
into an epoch of another length raises at its start (``on_epoch_begin``).
"""

import sys
from types import FrameType
from typing import Any, Callable, Dict, Mapping, Optional

import keras

from chainiter.dataset.convert import concat_examples
from chainiter.iterators import _loop
from chainiter.iterators.loader import Loader


def _building_the_model() -> bool:
    """Whether Keras asks for this batch to build the model, not to train
    on it: the first ``fit`` of a model takes a batch in
    ``Trainer._symbolic_build`` for its shapes, then starts the epoch
    anew."""
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == '_symbolic_build' and \
                frame.f_globals.get('__name__', '').startswith('keras.'):
            return True
        frame = frame.f_back
    return False


class KerasDataset(keras.utils.PyDataset):  # type: ignore[misc,name-defined]
    """A ``keras.utils.PyDataset`` over a chainiter iterator, for
    ``model.fit(KerasDataset(it), epochs=...)``: each Keras epoch is one
    of the iterator's epochs (``it.one_epoch()``), its batches stacked by
    ``converter``.

    Each ``ds[i]`` Keras asks for is the iterator's next batch, in the
    calling thread (``workers=1``: the iterator loads ahead in its own
    threads or processes): the order is the iterator's, seeded and
    resumable, whatever index Keras asks for (``fit(shuffle=True)``, the
    default, permutes the indices of a PyDataset's batches; the examples
    are shuffled by the iterator already).  Batches Keras asked for and
    did not train on (``fit`` looks at the first batch to build the model,
    then starts the epoch anew) are loaded again: the iterator is put back
    at the epoch's start, so ``state_dict()`` always counts the batches
    Keras trained on.

    ``num_batches`` is the number of batches the next Keras epoch gets:
    the iterator's epoch, or the rest of it after a resume mid-epoch.
    Keras reads it once when ``fit`` starts and uses it for every epoch of
    that fit, so:

    - the epochs must all have the same number of batches:
      ``repeat=False`` (every pass has ``ceil(n / batch_size)``, or
      ``floor`` with ``drop_last=True``), or ``repeat=True`` with an epoch
      size that is a multiple of the batch size (the global one when
      sharded); other iterators get a ``ValueError``;
    - loaded from a snapshot taken mid-epoch (``resumed_mid_epoch`` is
      True), the first ``fit`` finishes that epoch alone
      (``model.fit(ds, initial_epoch=e, epochs=e + 1)``), and the next
      ``fit`` goes on with whole epochs.  A fit that goes on past such an
      epoch raises a ``ValueError`` rather than cut its epochs short.

    Args:
        iterator: a chainiter iterator (or a :class:`chainiter.Loader`).
        converter: turns a list of examples into ``(x, y)`` arrays, as
            Keras takes them (default ``concat_examples``); not applied
            when the iterator stacks batches itself (a
            MultiprocessIterator with ``converter=concat_examples``).
        drop_last (bool): with ``repeat=False``, leave out the last batch
            of a pass when short.
    """

    def __init__(self, iterator: Any,
                 converter: Optional[Callable[..., Any]] = None,
                 drop_last: bool = False) -> None:
        super().__init__(workers=1, use_multiprocessing=False)
        self.loader = Loader(iterator, drop_last)
        self.iterator = self.loader.iterator
        self.converter = converter or concat_examples
        self._view: Any = None
        self._start: Optional[Dict[str, Any]] = None
        self._taken = 0
        self._ended_length: Optional[int] = None
        self._looked_at = False

    # ---- what Keras calls ------------------------------------------------

    @property
    def num_batches(self) -> int:
        self._ended_length = None     # a fit is reading it
        if self._view is not None:
            return len(self._view)
        return self.loader.batches_left

    def __len__(self) -> int:
        return self.num_batches

    def __getitem__(self, index: int) -> Any:
        if self._view is None:
            self._start = self.iterator.state_dict()
            self._view = iter(self.loader)
            self._taken = 0
            self._looked_at = _building_the_model()
        if not 0 <= index < len(self._view) or \
                self._taken >= len(self._view):
            raise IndexError(
                'batch {} of an epoch of {} batches, {} of them handed out '
                'already'.format(index, len(self._view), self._taken))
        batch = next(self._view)
        if getattr(self.iterator, 'converter', None) is None:
            batch = self.converter(batch)
        if isinstance(batch, list):
            batch = tuple(batch)
        self._taken += 1
        return batch

    def on_epoch_begin(self) -> None:
        # After an epoch of this fit ended, Keras reads num_batches only
        # when a new fit starts: the same fit goes on with as many batches
        # as its first epoch had.
        ended, coming = self._ended_length, self.loader.batches_left
        if ended is not None and self._view is None and coming != ended:
            raise ValueError(
                'Keras gives every epoch of a fit the number of batches it '
                'read when the fit started ({}), but the next epoch of the '
                'iterator has {}: with repeat=True the last batch of an '
                'epoch is filled up from the next epoch, so epochs differ '
                'by a batch, and a fit resumed mid-epoch starts with the '
                'rest of one. Fit one epoch at a time (model.fit(ds, '
                'initial_epoch=e, epochs=e + 1)), or use repeat=False (every '
                'pass the same number of batches) and finish an interrupted '
                'epoch with a fit of its own'.format(ended, coming))

    def on_epoch_end(self) -> None:
        view = self._view
        if view is None:
            return
        self._view = None
        if self._taken < len(view) or self._looked_at:
            # An epoch given up before its end, or fit's look at the first
            # batch to build the model (which ends the epoch it began,
            # even one of a single batch): the batches taken are loaded
            # again, so that the snapshot counts only those trained on.
            if self._taken:
                self.iterator.load_state_dict(self._start)
            return
        self._ended_length = len(view)

    # ---- snapshots and the iterator's life --------------------------------

    @property
    def resumed_mid_epoch(self) -> bool:
        """Whether the next Keras epoch begins mid-epoch (the iterator was
        loaded from a snapshot taken there): a fit of that epoch alone
        finishes it."""
        return self.loader.batches_left < len(self.loader)

    def state_dict(self) -> Dict[str, Any]:
        """The iterator's ``state_dict()``: the batches Keras trained on."""
        return self.iterator.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.iterator.load_state_dict(state_dict)
        self._view, self._taken = None, 0

    def finalize(self) -> None:
        self.iterator.finalize()

    def __enter__(self) -> 'KerasDataset':
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.finalize()
