"""The part every chainiter iterator shares (Chainer's iterator protocol,
``Iterator``, is in ``_protocol.py``).

::

    user ── next() ──► DatasetIterator ── advance(state) ──► Step
                          │    ▲                              │ transport:
                          │    └── adopt state_after ◄─ batch ┤ _submit,
                          │                                   │ _collect
                          └── _pending: PendingBatches
                              of (state_after, handle)

``DatasetIterator`` owns the epoch logic (through the pure ``advance``) and
the bookkeeping of batches dispatched ahead of the user (``_pending.py``).
Each pending batch travels with the state after it; the state is adopted
only when the batch is handed out, so a snapshot never counts prefetched
batches.  Its snapshots come from ``_serialize.py`` (the pure codec
``_snapshot.py`` reads and checks them; the iterator adopts what it read,
all of it or nothing), its Chainer attributes (``epoch``, ``epoch_detail``,
...) from ``_position.py``.  Its arguments are checked by ``_args.py``,
``shard=`` is resolved by ``_shard.py``; the PyTorch-style loop comes from
``_loop.py``, ``stats`` from ``_stats.py``.

A transport subclass implements ``_submit(step) -> handle`` (start loading a
batch) and ``_collect(handle) -> batch`` (wait for it), and may set or
override:

- ``_prefetch_depth``: how many batches are loaded ahead of the one handed
  out;
- ``_drop_pending()``: forget the batches dispatched (cancel them, then call
  the base's);
- ``_collected()``: called after each ``_collect``, before the batch is
  taken;
- ``_interrupted_waiting()``: whether an exception came while ``next()``
  waited and changed nothing (the pending batches are then kept);
- ``_start_transport()`` and ``_transport_attributes()``: make the threads
  or processes (at construction and after unpickling), and name the
  attributes never copied or pickled;
- ``_ready_batches()`` and ``_stats_window_started()`` (``_stats.py``): the
  transport's part of ``stats``;
- ``finalize()``: release the transport, then call the base's.
"""

import copy
import threading
import time
from typing import Any, Callable, Optional, Tuple, TypeVar, Union

import numpy

from chainiter import _chainer_compat, _context
from chainiter.errors import (
    ChainiterError,
    IteratorFinalizedError,
)
from chainiter.iterators import (
    _args,
    _loop,
    _orders,
    _position,
    _serialize,
    _shard,
    _state,
    _stats,
    order_samplers,
)
from chainiter.iterators._pending import Failed, PendingBatches
# Iterator is imported from here by dataset/__init__.py.
from chainiter.iterators._protocol import Iterator

#: Seeded orders kept: a batch loaded again after an interrupt or a
#: snapshot finds its order's indices already computed.
KEPT_ORDERS = 3

_SelfD = TypeVar('_SelfD', bound='DatasetIterator')


class DatasetIterator(_loop.EpochLoop, _stats.InputStats,
                      _serialize.Snapshots, _position.Position, Iterator):
    """Base of SerialIterator, MultithreadIterator and MultiprocessIterator.

    The PyTorch-style loop (``len``, ``one_epoch()``) comes from
    ``_loop.py``, ``stats`` from ``_stats.py``.  Subclasses implement
    ``_submit`` and ``_collect`` and the other transport hooks they need
    (the module's docstring lists them).
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
        self._pending = PendingBatches()
        self._orders = _orders.RecentOrders(KEPT_ORDERS)
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

    def _collected(self):
        """Called once ``_collect`` has returned the batch, before
        ``next()`` takes it: an exception here has it loaded again."""

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
            return _state.IteratorState(
                0, 0, False, order,
                sampler_state=_orders.capture(self.order_sampler))
        if self._shuffle:
            return _state.IteratorState(0, 0, False, self._orders.get(
                order_samplers.pass_seed(
                    self._seed if seed is None else seed,
                    self._resets if resets is None else resets), 0, n))
        return _state.IteratorState(0, 0, False, None)

    def _next_order(self, order, position, epoch):
        n = len(self.dataset)
        if self.order_sampler is not None:
            new = _state.check_order(self.order_sampler(order, position),
                                     n, len(order))
            return new, _orders.capture(self.order_sampler)
        return self._orders.get(self._pass_seed, epoch, n), None

    def _rewind(self):
        """Drop the batches dispatched ahead; the next batch is loaded anew
        from the adopted state.  (Stale until done: an interrupt that cuts
        it short, in ``reset()`` or a snapshot's load too, leaves the next
        ``next()`` to rewind.)"""
        self._stale = True
        self._drop_pending()
        self._ahead = self._state
        _orders.restore(self.order_sampler, self._state.sampler_state)
        self._stale = False

    def _dispatch_until(self, count):
        while len(self._pending) < count:
            if self._pending.closed():
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
                self._pending.append((self._ahead, Failed(e)))
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
            if isinstance(handle, Failed):
                raise handle.error
            batch = self._collect(handle)
            self._collected()
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
    def global_batch_size(self) -> int:
        """Examples per step over all ranks: ``size * batch_size`` when
        sharded, else ``batch_size``."""
        return self.batch_size * (1 if self._shard is None else
                                  self._shard.size)

    @property
    def _pass_seed(self):
        """The seed of the current pass: ``seed`` until the first
        ``reset()``, then one derived from ``(seed, resets)``."""
        return order_samplers.pass_seed(self._seed, self._resets)

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
        self._pending = PendingBatches()
        self._orders = _orders.RecentOrders(KEPT_ORDERS)
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
