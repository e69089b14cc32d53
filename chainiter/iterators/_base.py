"""The iterator protocol and the part every chainiter iterator shares.

::

    user ── next() ──► DatasetIterator ── advance(state) ──► Step(spans, orders)
                          │    ▲                                  │
                          │    └── adopt state_after ◄── batch ◄──┤ transport
                          │                                       │ (_submit/_collect)
                          └── pending: deque[(state_after, handle)]

``DatasetIterator`` owns the epoch logic (through the pure ``advance``), the
snapshot format and the bookkeeping of batches dispatched ahead of the user.
A transport subclass only implements ``_submit(step) -> handle`` (start
loading a batch) and ``_collect(handle) -> batch`` (wait for it).  Each
pending batch travels with the state after it; the state is adopted only when
the batch is handed out, so a snapshot never counts prefetched batches.
"""

import collections
import copy
import threading
import time
from typing import (
    Any, Callable, Deque, Dict, Mapping, Optional, Tuple, TypeVar, Union)

import numpy

from chainiter import _chainer_compat, _context
from chainiter.errors import (
    ChainiterError,
    IteratorFinalizedError,
    SnapshotMismatchError,
)
from chainiter.iterators import (
    _args,
    _loop,
    _shard,
    _state,
    _stats,
    order_samplers,
)
from chainiter.serializers.npz import DictionarySerializer, NpzDeserializer

#: Version of the snapshot layout written by ``serialize`` (3: a seeded
#: shuffle's order is named by ``seeded_order``, not stored; a sharded
#: iterator adds ``shard_size`` and ``global_batch_size``, which older
#: versions ignore).
SNAPSHOT_FORMAT_VERSION = 3

_Self = TypeVar('_Self', bound='Iterator')
_SelfD = TypeVar('_SelfD', bound='DatasetIterator')


class _Root:
    """The base of ``Iterator``: an empty class that Chainer's own Iterator
    replaces when Chainer is loaded (see ``chainiter._chainer_compat``;
    Python lets a class's base be swapped for a plain class, not for
    ``object``)."""


class Iterator(_Root):
    """Chainer's iterator protocol: ``next()``, ``finalize()``, ``serialize``."""

    def __iter__(self: _Self) -> _Self:
        return self

    def __next__(self) -> Any:
        raise NotImplementedError

    def next(self) -> Any:
        return self.__next__()

    def finalize(self) -> None:
        """Release the resources of the iterator.  Idempotent."""

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any,
                 traceback: Any) -> None:
        self.finalize()

    def serialize(self, serializer: Any) -> None:
        """Save or load the iterator's state (Chainer's protocol)."""


def _is_deserializer(serializer):
    # Ours and Chainer's deserializers alike.
    return any(cls.__name__ == 'Deserializer'
               for cls in type(serializer).__mro__)


def _is_chainers(serializer):
    # Chainer's serializers derive from the classes of chainer.serializer
    # (known by their module: Chainer is never imported to ask).
    return any(cls.__module__ == 'chainer.serializer'
               for cls in type(serializer).__mro__)


def _scalar(value, key):
    if value.shape != ():
        raise SnapshotMismatchError(
            'the snapshot\'s {} must be a single number, got an array of '
            'shape {}'.format(key, value.shape))
    return value


def _integer(value, key):
    """A snapshot field that must be an integer (integral floats, as a
    state dict passed through JSON has them, are taken)."""
    value = _scalar(value, key)
    kind = value.dtype.kind
    if kind in 'iu' or (kind == 'f' and numpy.isfinite(value)
                        and float(value).is_integer()):
        number = int(value)
        if -2 ** 63 <= number < 2 ** 63:
            return number
    raise SnapshotMismatchError(
        'the snapshot\'s {} must be an integer, got {!r} of dtype {}'.format(
            key, value.item(), value.dtype))


def _flag(value, key):
    value = _scalar(value, key)
    if value.dtype.kind == 'b' or (value.dtype.kind in 'iu'
                                   and int(value) in (0, 1)):
        return bool(value)
    raise SnapshotMismatchError(
        'the snapshot\'s {} must be a bool, got {!r} of dtype {}'.format(
            key, value.item(), value.dtype))


def _real(value, key):
    value = _scalar(value, key)
    if value.dtype.kind in 'iuf' and numpy.isfinite(value):
        return float(value)
    raise SnapshotMismatchError(
        'the snapshot\'s {} must be a finite number, got {!r}'.format(
            key, value.item()))


class _Failed:
    """A pending batch whose indices could not be computed."""

    def __init__(self, error):
        self.error = error


class DatasetIterator(_loop.EpochLoop, _stats.InputStats, Iterator):
    """Base of SerialIterator, MultithreadIterator and MultiprocessIterator.

    The PyTorch-style loop (``len``, ``one_epoch()``) comes from
    ``_loop.py``, ``stats`` from ``_stats.py``.  Subclasses set
    ``_prefetch_depth`` (batches loaded ahead of the one being handed out)
    and implement ``_submit`` and ``_collect``.
    """

    _prefetch_depth = 0

    #: Write the epoch's order into snapshots even when it follows from the
    #: seed (8 bytes an example), so that Chainer's iterators can load them
    #: (always done for Chainer's own serializers).
    save_order = False

    #: Where Chainer's iterator of this kind writes the epoch's order in a
    #: snapshot, and whether it writes None (no shuffle) there too.
    _chainer_order = ('order', False)

    def __init__(self, dataset: Any, batch_size: int, repeat: bool = True,
                 shuffle: Optional[bool] = None,
                 order_sampler: Optional[Callable[[Any, int], Any]] = None,
                 seed: Optional[int] = None,
                 shard: Union[Tuple[int, int], str, Any, None] = None
                 ) -> None:
        _chainer_compat.adopt_if_loaded()
        self.dataset = _args.dataset(dataset)
        self.batch_size = _args.positive_int('batch_size', batch_size)
        self._repeat = bool(repeat)
        self._shuffle = _args.shuffles(shuffle, order_sampler)
        self.order_sampler = _args.callable_or_none(
            'order_sampler', order_sampler)
        if seed is None and not self._shuffle:
            # As Chainer's, an iterator that does not shuffle draws nothing
            # from numpy's global RNG (a model initialised after it gets
            # the same weights); its seed still follows numpy.random.seed.
            self._seed = order_samplers.seed_from_global_state()
        else:
            self._seed = order_samplers.check_seed(seed)
        self._shard, self._seed_given = None, seed is not None
        if shard is not None:
            self._shard, self._seed = _shard.resolve(
                shard, seed, self._seed,
                (('batch_size', self.batch_size),
                 ('len(dataset)', len(dataset)), ('shuffle', self._shuffle),
                 ('repeat', self._repeat)))
        self._resets = 0
        _args.repeatable(self._repeat, len(dataset))
        self._finalized = False
        self._busy: Union[bool, int] = False   # or the caller's thread id
        self._stale = False     # the pending batches need a rewind
        self._pending: Deque[Tuple[Any, Any]] = collections.deque()
        # The last few seeded orders, by key.
        self._orders: Dict[Any, Any] = {}
        self._state = self._initial_state()
        self._ahead = self._state
        self._timing = _stats.Timing()

    # ---- transport hooks -------------------------------------------------

    def _submit(self, step):
        """Start loading ``step``; return a handle for ``_collect``."""
        return step

    def _collect(self, handle):
        """Wait for the batch of ``handle`` and return it."""
        return self._load_batch(handle)

    def _drop_pending(self):
        """Forget every dispatched batch (a transport may cancel them)."""
        self._pending.clear()

    def _interrupted_waiting(self):
        """Whether the exception going up from ``next()`` came while it
        waited for its batch and had changed nothing: the batches
        dispatched ahead are then kept, as they are, for the next call.
        Asked once per exception."""
        return False

    def _load_batch(self, step):
        return _context.load_examples(self.dataset, step.indices,
                                      self._pass_seed, step.spans, [])

    # ---- state -----------------------------------------------------------

    def _initial_state(self, resets=None, seed=None):
        """The state at epoch 0 of the pass after ``resets`` resets with
        ``seed`` (default: the iterator's)."""
        n = len(self.dataset)
        if self.order_sampler is not None:
            order = _state.check_order(
                self.order_sampler(numpy.arange(n), 0), n)
            return _state.IteratorState(0, 0, False, order,
                                        sampler_state=self._capture_sampler())
        if self._shuffle:
            return _state.IteratorState(0, 0, False, self._seeded(
                0, order_samplers.pass_seed(
                    self._seed if seed is None else seed,
                    self._resets if resets is None else resets)))
        return _state.IteratorState(0, 0, False, None)

    def _seeded(self, epoch, pass_seed=None):
        # The last few are kept: a batch loaded again after an interrupt
        # or a snapshot finds its order's indices already computed.
        key = (self._pass_seed if pass_seed is None else pass_seed, epoch,
               len(self.dataset))
        orders = self._orders
        order = orders.get(key)
        if order is None:
            order = orders[key] = order_samplers.SeededPermutation(*key)
            while len(orders) > 3:
                del orders[next(iter(orders))]
        return order

    def _next_order(self, order, position, epoch):
        if self.order_sampler is not None:
            new = _state.check_order(self.order_sampler(order, position),
                                     len(self.dataset), len(order))
            return new, self._capture_sampler()
        return self._seeded(epoch), None

    def _capture_sampler(self):
        serialize = getattr(self.order_sampler, 'serialize', None)
        if serialize is None:
            return None
        target = {}
        serialize(DictionarySerializer(target))
        return target

    def _restore_sampler(self, sampler_state):
        if sampler_state is not None:
            self.order_sampler.serialize(NpzDeserializer(sampler_state))

    def _rewind(self):
        """Drop the batches dispatched ahead; the next batch is loaded anew
        from the adopted state.  (Stale until done: an interrupt that cuts
        it short, in ``reset()`` or a snapshot's load too, leaves the next
        ``next()`` to rewind.)"""
        self._stale = True
        self._drop_pending()
        self._ahead = self._state
        self._restore_sampler(self._state.sampler_state)
        self._stale = False

    def _dispatch_until(self, count):
        while len(self._pending) < count:
            if self._pending and (self._pending[-1][1] is None or isinstance(
                    self._pending[-1][1], _Failed)):
                return  # the end of the iteration, or an error, is queued
            try:
                ahead, step = _state.advance(
                    self._ahead, self.global_batch_size, self._repeat,
                    len(self.dataset), self._next_order)
                if step is not None and self._shard is not None:
                    order = self._ahead.order
                    step, padding = _shard.shard_step(
                        step, self._shard, order, len(self.dataset)
                        if order is None else len(order))
                    ahead = ahead._replace(padding=padding)
            except Exception as e:
                # Raised from the next() that would return this batch.
                self._pending.append((self._ahead, _Failed(e)))
                return
            if step is None:
                self._pending.append((ahead, None))
                return
            self._pending.append((ahead, self._submit(step)))
            self._ahead = ahead

    # ---- the protocol ----------------------------------------------------

    def __next__(self) -> Any:
        started = time.perf_counter()   # for stats
        # One caller at a time: a second thread gets a clear error instead
        # of corrupting the state (the test and the set run with no
        # switch of thread or signal handler between them).
        me = threading.get_ident()
        busy = self._busy
        if busy == me:
            # This thread's last call was cut short before it could say it
            # ended (a second signal in its except clause): not two
            # threads, but what it loaded ahead may be stale.
            self._stale = True
        elif busy:
            raise ChainiterError(
                'next() was called on {} from two threads at once; call it '
                'from one thread at a time (guard it with a lock to share '
                'the iterator)'.format(type(self).__name__))
        self._busy = me
        try:
            self._check_alive()
            if self._stale:
                # A second interrupt cut the last rewind short.
                self._rewind()
            self._dispatch_until(1)
            state, handle = self._pending[0]
            if handle is None:
                self._state = state     # Chainer updates previous_epoch_detail
                raise StopIteration
            if isinstance(handle, _Failed):
                raise handle.error
            batch = self._collect(handle)
            # Loading ahead comes before the batch is consumed: whatever
            # fails or interrupts it, the batch is loaded again next time.
            self._dispatch_until(self._prefetch_depth + 1)
            self._pending.popleft()
            self._count_batch(started, self._state, state)
        except StopIteration:
            self._busy = False
            raise
        except BaseException as e:
            # First: the batches dispatched ahead are stale until the
            # rewind below has run (the next call rewinds if it was cut
            # short), unless the exception came while the call waited
            # for its batch (a Ctrl-C there is the most common): they
            # are then as they were.  A second signal before _busy is
            # cleared has the next call rewind (it finds its own id).
            intact = self._interrupted_waiting()
            if not intact:
                self._stale = True
            self._busy = False
            if isinstance(e, IteratorFinalizedError):
                raise
            if self._finalized:     # finalize() from another thread
                raise IteratorFinalizedError(
                    '{} was finalized while next() waited for a '
                    'batch'.format(type(self).__name__)) from e
            # The state stays where it was (any exception, KeyboardInterrupt
            # included); the batches dispatched ahead are loaded again,
            # unless intact: then the next call waits for the same batch.
            if not intact:
                self._rewind()
            raise
        # Nothing between here and the return lets a signal handler run, so
        # a KeyboardInterrupt cannot consume the batch without delivering it.
        self._busy = False
        self._state = state
        return batch

    def _check_alive(self):
        if self._finalized:
            raise IteratorFinalizedError(
                '{} was finalized (finalize() was called or its with-block '
                'ended); create a new iterator to go on'.format(
                    type(self).__name__))

    def reset(self) -> None:
        """Start a new pass at epoch 0 (allowed at any time).

        As in Chainer, the new pass has a new order: an order sampler is
        asked for one, and a seeded shuffle draws the orders of the
        ``k``-th reset from ``(seed, k)`` (and so does ``example_rng()``),
        so runs stay repeatable and a snapshot (which holds ``k``) resumes.
        """
        self._check_alive()
        self._rewind()
        resets = self._resets + 1
        state = self._initial_state(resets)
        # All of it or nothing (no call between the stores, so no signal
        # handler runs there).
        self._resets, self._state, self._ahead = resets, state, state

    def _synchronize(self, seed):
        """Start over at epoch 0 with ``seed`` (the one every rank got
        from rank 0: ``create_synchronized_iterator``)."""
        self._check_alive()
        self._stale = True
        self._drop_pending()    # the order sampler may be a new one
        seed = order_samplers.check_seed(seed)
        state = self._initial_state(0, seed)
        self._seed, self._resets, self._state, self._ahead = \
            seed, 0, state, state

    def finalize(self) -> None:
        self._finalized = True
        self._drop_pending()

    @property
    def repeat(self) -> bool:
        return self._repeat

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def shard(self) -> Optional[_shard.Shard]:
        """``Shard(rank, size)`` of a sharded iterator, else None."""
        return self._shard

    @property
    def global_batch_size(self) -> int:
        """Examples per step over all ranks: ``size * batch_size`` when
        sharded, else ``batch_size``."""
        return self.batch_size * (1 if self._shard is None else
                                  self._shard.size)

    @property
    def padding(self) -> int:
        """How many of the last batch's rows repeat an example from the
        epoch's start to give every rank an equal share of the last, short
        global batch (sharded, ``repeat=False``); 0 otherwise."""
        return self._state.padding

    @property
    def _pass_seed(self):
        """The seed of the current pass: ``seed`` until the first
        ``reset()``, then one derived from ``(seed, resets)``."""
        return order_samplers.pass_seed(self._seed, self._resets)

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

    # ---- snapshots -------------------------------------------------------

    def serialize(self, serializer: Any) -> None:
        if _is_deserializer(serializer):
            self._load_snapshot(serializer)
        else:
            own = DictionarySerializer()
            self._save_snapshot(own)
            self._write_snapshot(serializer, own.target)

    def _write_snapshot(self, serializer, items):
        """Write ``items``, a snapshot in chainiter's layout (as
        ``state_dict()`` has it), into ``serializer``: into Chainer's (and
        with ``save_order``) with the epoch's order as Chainer writes it."""
        chainers = _is_chainers(serializer)
        if chainers or self.save_order:
            items = self._as_chainer_writes(items, chainers)
        for key, value in items.items():
            serializer(key, value)

    def _as_chainer_writes(self, items, chainers):
        """``items`` with the epoch's order as Chainer's iterator of this
        kind writes it: a seeded order written out, under Chainer's key
        (``_order`` for MultithreadIterator), and None where Chainer
        writes it (into Chainer's serializers only: chainiter's snapshots
        hold no pickled value).  The seed stays: chainiter reading it back
        keeps its seed, Chainer reads only the keys it knows."""
        items = dict(items)
        key, writes_none = self._chainer_order
        order = None
        for name in ('order', '_order'):
            value = items.pop(name, None)
            if value is not None and numpy.asarray(value).dtype != object:
                order = value
        if order is None and bool(items.get('seeded_order', False)):
            order = order_samplers.seeded_order(
                order_samplers.pass_seed(int(items['seed']),
                                         int(items['reset_count'])),
                int(items['epoch']), int(items['dataset_length']))
        if order is not None or (writes_none and chainers):
            items[key] = order
        return items

    def _save_snapshot(self, serializer):
        """Write the snapshot in chainiter's layout: a seeded order is
        named by ``seeded_order`` and the seed, not stored."""
        state = self._state
        serializer('format_version', SNAPSHOT_FORMAT_VERSION)
        serializer('current_position', state.current_position)
        serializer('epoch', state.epoch)
        serializer('is_new_epoch', state.is_new_epoch)
        if isinstance(state.order, order_samplers.SeededPermutation):
            serializer('seeded_order', True)
        elif state.order is not None:
            serializer('order', state.order)
        serializer('previous_epoch_detail', state.previous_epoch_detail)
        serializer('seed', self._seed)
        serializer('reset_count', self._resets)
        serializer('dataset_length', len(self.dataset))
        if self._shard is not None:
            serializer('shard_size', self._shard.size)
            serializer('global_batch_size', self.global_batch_size)
        if state.sampler_state is not None:
            child = serializer['order_sampler']
            for key, value in state.sampler_state.items():
                child(key, value)

    def _load_snapshot(self, serializer):
        """Read a snapshot, check every field, then adopt it; a snapshot
        that fails leaves the iterator (and its order sampler) as it was."""
        def read(key):
            try:
                value = serializer(key, None)
            except KeyError:
                return None
            return None if value is None else numpy.asarray(value)

        def required(key):
            value = read(key)
            if value is None:
                raise SnapshotMismatchError(
                    'the snapshot has no {!r}; it is not an iterator '
                    'snapshot, or the iterator lies under a path (pass '
                    'path=, e.g. "updater/iterator:main/")'.format(key))
            return value

        n = len(self.dataset)
        version = read('format_version')
        if version is not None and _integer(version, 'format_version') > \
                SNAPSHOT_FORMAT_VERSION:
            raise SnapshotMismatchError(
                'the snapshot has format version {}, newer than this '
                'chainiter understands ({}); upgrade chainiter'.format(
                    int(version), SNAPSHOT_FORMAT_VERSION))
        length = read('dataset_length')
        if length is not None and _integer(length, 'dataset_length') != n:
            raise SnapshotMismatchError(
                'the snapshot was written for a dataset of length {}, but '
                'this iterator\'s dataset has length {}'.format(int(length), n))
        position = _integer(required('current_position'), 'current_position')
        epoch = _integer(required('epoch'), 'epoch')
        is_new_epoch = _flag(required('is_new_epoch'), 'is_new_epoch')
        seeded = read('seeded_order')
        seeded = seeded is not None and _flag(seeded, 'seeded_order')
        order = read('order')
        if order is None:
            order = read('_order')
        if seeded and not self._shuffle:
            raise SnapshotMismatchError(
                'the snapshot was written by an iterator whose order follows '
                'from its seed (shuffle=True), but this iterator {}; build '
                'it with shuffle=True and no order_sampler to load it'.format(
                    'uses an order_sampler' if self.order_sampler is not None
                    else 'does not shuffle'))
        shuffles = self._shuffle or self.order_sampler is not None
        if order is None and shuffles and not seeded:
            raise SnapshotMismatchError(
                'the snapshot has no order, so it was written by an iterator '
                'that does not shuffle; this one shuffles. Build the iterator '
                'with shuffle=False to load it')
        if order is not None:
            if not shuffles:
                raise SnapshotMismatchError(
                    'the snapshot holds a shuffled order, but this iterator '
                    'does not shuffle; build it with shuffle=True (or the '
                    'same order_sampler) to load it')
            order = self._snapshot_order(order, n)
        size = n if order is None else len(order)
        if not 0 <= position <= size or epoch < 0:
            raise SnapshotMismatchError(
                'the snapshot position (epoch {}, position {}) does not fit '
                'an epoch of {} examples'.format(epoch, position, size))
        seed = read('seed')
        if seed is not None:
            seed = _integer(seed, 'seed')
            if not 0 <= seed < 2 ** 63:
                raise SnapshotMismatchError(
                    'the snapshot has seed {}; a seed is in [0, 2**63)'.format(
                        seed))
        self._check_shard_fields(read)
        resets = read('reset_count')
        resets = 0 if resets is None else _integer(resets, 'reset_count')
        if resets < 0:
            raise SnapshotMismatchError(
                'the snapshot has reset_count {}; it must be >= 0'.format(
                    resets))
        previous = read('previous_epoch_detail')
        if previous is not None:
            previous = _real(previous, 'previous_epoch_detail')
        else:
            # Snapshots of old Chainer versions lack it; guess as Chainer does.
            previous = epoch + (position - self.global_batch_size) / max(
                size, 1)
            if epoch + position / max(size, 1) > 0:
                previous = max(previous, 0.0)
            else:
                previous = _state.NO_PREVIOUS_EPOCH_DETAIL
        sampler_state = None
        # From here the order sampler may hold the snapshot's state, and
        # an interrupt leave it there: the next next() restores it from
        # the state in force.
        self._stale = True
        if getattr(self.order_sampler, 'serialize', None) is not None:
            before = self._capture_sampler()
            try:
                self.order_sampler.serialize(serializer['order_sampler'])
            except KeyError:
                pass  # written without sampler state (e.g. by Chainer)
            except Exception as e:
                self._restore_sampler(before)
                raise SnapshotMismatchError(
                    'the snapshot\'s order_sampler state does not fit this '
                    'iterator\'s order sampler ({}: {})'.format(
                        type(e).__name__, e)) from e
            sampler_state = self._capture_sampler()
        if self._shard is not None and self._seed_given and \
                seed is not None and seed != self._seed:
            raise SnapshotMismatchError(
                'the snapshot was written with seed {}, but this sharded '
                'iterator was built with seed={}: every rank must load the '
                'same run. Build it with seed={} (or seed=None) to load '
                'it'.format(seed, self._seed, seed))
        if seeded:
            if seed is None:
                raise SnapshotMismatchError(
                    'the snapshot says its order follows from the seed, but '
                    'it holds no seed')
            derived = order_samplers.SeededPermutation(
                order_samplers.pass_seed(seed, resets), epoch, n)
            if order is not None and not numpy.array_equal(order, derived):
                raise SnapshotMismatchError(
                    'the snapshot\'s order is not the one its seed gives for '
                    'epoch {}; the snapshot is corrupt'.format(epoch))
            order = derived
        # Everything fits: adopt it, all of it or nothing (no call between
        # the stores).
        self._drop_pending()
        state = _state.IteratorState(position, epoch, is_new_epoch, order,
                                     previous, sampler_state)
        self._seed, self._resets, self._state, self._ahead = \
            self._seed if seed is None else seed, resets, state, state

    def _check_shard_fields(self, read):
        """A snapshot of a sharded iterator loads on any number of ranks
        with any batch size (elastic): the state is the global position.
        Its shard fields are checked for sense only."""
        size, global_batch = read('shard_size'), read('global_batch_size')
        if (size is None) != (global_batch is None):
            raise SnapshotMismatchError(
                'the snapshot has {} but not {}; it is corrupt'.format(
                    *(('shard_size', 'global_batch_size') if
                      global_batch is None else
                      ('global_batch_size', 'shard_size'))))
        if size is None:
            return
        size = _integer(size, 'shard_size')
        global_batch = _integer(global_batch, 'global_batch_size')
        if size < 1 or global_batch < 1 or global_batch % size:
            raise SnapshotMismatchError(
                'the snapshot has shard_size {} and global_batch_size {}: '
                'a global batch is shard_size (>= 1) times the batch size '
                '(>= 1); the snapshot is corrupt'.format(size, global_batch))

    def _snapshot_order(self, order, n):
        if order.ndim == 0 and order.dtype == object:
            return None   # Chainer writes None as a 0-d object array
        if order.ndim != 1 or order.dtype.kind not in 'iu':
            raise SnapshotMismatchError(
                'the snapshot\'s order must be a 1-d array of integers, got '
                'shape {} of dtype {}'.format(order.shape, order.dtype))
        # An order sampler's epoch may be longer or shorter than the
        # dataset; a seeded shuffle's is a permutation of it.
        if self._shuffle:
            if len(order) != n:
                raise SnapshotMismatchError(
                    'the snapshot was written for a dataset of length {} '
                    '(its order has {} entries), but this iterator\'s '
                    'dataset has length {}'.format(len(order), len(order), n))
            if n and 0 <= order.min() and order.max() < n and \
                    numpy.bincount(order, minlength=n).max() > 1:
                raise SnapshotMismatchError(
                    'the snapshot\'s order repeats indices; a shuffled '
                    'order is a permutation of range({})'.format(n))
        try:
            return _state.check_order(order, n)
        except ValueError as e:
            raise SnapshotMismatchError(
                'the snapshot\'s order does not fit this iterator\'s '
                'dataset of length {}: {}'.format(n, e)) from e

    # ---- copies and pickles ---------------------------------------------

    def _start_transport(self):
        """Make what loading needs (threads, processes): called by the
        subclass's constructor and after unpickling."""

    def _transport_attributes(self):
        """Attributes never copied or pickled: the transport, caches."""
        return ('_pending', '_orders')

    def __getstate__(self):
        # Everything but the transport; batches loaded ahead are not part
        # of it.  Subclasses' own attributes come along.
        drop = self._transport_attributes()
        return {key: value for key, value in self.__dict__.items()
                if key not in drop}

    def __setstate__(self, pickled):
        self.__dict__.update(pickled)
        self._pending = collections.deque()
        self._orders = {}
        self._busy = False
        self._stale = False
        self._finalized = False
        self._timing = _stats.Timing()     # a copy counts its own batches
        self._start_transport()
        self._rewind()      # load on from the state, the sampler's too

    def __copy__(self: _SelfD) -> _SelfD:
        """An independent iterator at the same state, with its own
        transport; the dataset is shared.  An order sampler with state
        (a ``serialize`` method) is copied, as the copy restores that state;
        one without is shared, as Chainer's copies share it."""
        pickled = self.__getstate__()
        if hasattr(self.order_sampler, 'serialize'):
            pickled['order_sampler'] = copy.deepcopy(self.order_sampler)
        new = type(self).__new__(type(self))
        new.__setstate__(pickled)
        return new

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
