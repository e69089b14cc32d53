"""Where an iterator stands, as Chainer's iterators tell it (``epoch``,
``current_position``, ``is_new_epoch``, ``epoch_size``, ``epoch_detail``,
``previous_epoch_detail``), and what it was built with (``repeat``,
``seed``, ``shard``, ``padding``): read-only attributes, read from the
state the iterator adopted (``_state.py``)."""

from typing import Any, Optional

from chainiter.iterators import _state
from chainiter.iterators._shard import Shard
from chainiter.iterators._state import IteratorState


class Position:
    """What ``DatasetIterator`` gets for Chainer's attributes."""

    dataset: Any
    _state: IteratorState
    _repeat: bool
    _seed: int
    _shard: Optional[Shard]

    @property
    def repeat(self) -> bool:
        return self._repeat

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def shard(self) -> Optional[Shard]:
        """``Shard(rank, size)`` of a sharded iterator, else None."""
        return self._shard

    @property
    def padding(self) -> int:
        """How many of the last batch's rows repeat an example from the
        epoch's start to give every rank an equal share of the last, short
        global batch (sharded, ``repeat=False``); 0 otherwise."""
        return self._state.padding

    @property
    def epoch(self) -> int:
        return self._state.epoch

    @property
    def current_position(self) -> int:
        return self._state.current_position

    @property
    def is_new_epoch(self) -> bool:
        return self._state.is_new_epoch

    @property
    def epoch_size(self) -> int:
        order = self._state.order
        return len(self.dataset) if order is None else len(order)

    @property
    def epoch_detail(self) -> float:
        return _state.epoch_detail(self._state, len(self.dataset))

    @property
    def previous_epoch_detail(self) -> Optional[float]:
        value = self._state.previous_epoch_detail
        return None if value < 0 else value
