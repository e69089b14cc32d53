"""An iterator's snapshots: ``serialize`` (Chainer's protocol),
``state_dict`` and ``load_state_dict``.  The pure codec (``_snapshot.py``)
writes the fields and reads and checks them; here the iterator saves its
state and adopts what was read, all of it or nothing.  An order sampler's
own state is read here, as that changes the sampler."""

from typing import Any, Dict, Mapping

from chainiter.errors import SnapshotMismatchError
from chainiter.iterators import _orders, _snapshot
from chainiter.serializers.npz import DictionarySerializer, NpzDeserializer

SNAPSHOT_FORMAT_VERSION = _snapshot.FORMAT_VERSION


class Snapshots:
    """What ``DatasetIterator`` gets for its snapshots."""

    def serialize(self, serializer: Any) -> None:
        if _snapshot.is_deserializer(serializer):
            self._load_snapshot(serializer)
        else:
            own = DictionarySerializer()
            self._save_snapshot(own)
            self._write_snapshot(serializer, own.target)

    def _write_snapshot(self, serializer, items):
        """Write ``items``, a snapshot in chainiter's layout (as
        ``state_dict()`` has it), into ``serializer``: into Chainer's (and
        with ``save_order``) with the epoch's order as Chainer writes it."""
        chainers = _snapshot.is_chainers(serializer)
        if chainers or self.save_order:
            items = _snapshot.as_chainer_writes(
                items, self._chainer_order, chainers)
        for key, value in items.items():
            serializer(key, value)

    def _save_snapshot(self, serializer):
        shard = self._shard
        _snapshot.save(serializer, self._state, self._seed, self._resets,
                       len(self.dataset), None if shard is None else
                       shard.size, self.global_batch_size)

    def _load_snapshot(self, serializer):
        """Read a snapshot, check every field, then adopt it; a snapshot
        that fails leaves the iterator (and its order sampler) as it was."""
        read = _snapshot.read(serializer, _snapshot.Target(
            len(self.dataset), self._shuffle, self.order_sampler is not None,
            self.global_batch_size, self._seed if self._shard is not None
            and self._seed_given else None))
        # From here the order sampler may hold the snapshot's state, and
        # an interrupt leave it there: the next next() restores it from
        # the state in force.
        self._stale = True
        sampler_state = self._load_sampler(serializer, read.version)
        # Everything fits: adopt it, all of it or nothing (no call between
        # the stores).
        self._drop_pending()
        state = read.state._replace(sampler_state=sampler_state)
        self._seed, self._resets, self._state, self._ahead = \
            self._seed if read.seed is None else read.seed, read.resets, \
            state, state

    def _load_sampler(self, serializer, version):
        """Load the order sampler's state from the snapshot and return it
        (None for a sampler without state).  Only Chainer's snapshots
        (``version`` None) may hold none of it: the sampler keeps its own.
        A state that does not fit, or lacks a field, leaves the sampler as
        it was."""
        if getattr(self.order_sampler, 'serialize', None) is None:
            return None
        before = _orders.capture(self.order_sampler)
        child = serializer['order_sampler']
        if not _snapshot.holds_sampler_state(child, before, version,
                                             self.order_sampler):
            return before   # written by Chainer, without sampler state
        try:
            self.order_sampler.serialize(child)
        except Exception as e:
            _orders.restore(self.order_sampler, before)
            raise SnapshotMismatchError(
                'the snapshot\'s order_sampler state does not fit this '
                'iterator\'s order sampler ({}: {})'.format(
                    type(e).__name__, e)) from e
        return _orders.capture(self.order_sampler)

    def state_dict(self) -> Dict[str, Any]:
        """The snapshot as a plain dict of Python scalars and numpy arrays."""
        serializer = DictionarySerializer()
        self.serialize(serializer)
        return {key: value.item() if value.ndim == 0 else value
                for key, value in serializer.target.items()}

    def load_state_dict(self,
                        state_dict: Mapping[str, Any]) -> None:
        """Load a dict made by ``state_dict()``."""
        self._load_snapshot(NpzDeserializer(state_dict))
