"""The pure core of every iterator: an immutable state and ``advance``.

Every iterator kind (serial, threads, processes) keeps one ``IteratorState``
and calls ``advance`` to learn which dataset indices make up the next batch
and what the state is after it.  Nothing here touches a dataset, a thread or
a process; the transports only turn a ``Step``'s indices into examples.

Epoch semantics are Chainer's: with ``repeat=True`` the last batch of an
epoch is filled up from the next epoch's order and ``is_new_epoch`` is True on
it; with ``repeat=False`` the last batch is short and the following call
returns no step (the iterator raises ``StopIteration``).
"""

import typing

import numpy

#: Value of ``previous_epoch_detail`` before the first batch (Chainer uses -1
#: internally and shows ``None``).
NO_PREVIOUS_EPOCH_DETAIL = -1.0


class IteratorState(typing.NamedTuple):
    """Where an iterator stands.  Never mutated; ``advance`` returns a new one.

    ``order`` is the current epoch's order (a ``SeededPermutation`` for a
    seeded shuffle, an array from an order sampler or a snapshot), or
    ``None`` for the identity order: anything with ``len()`` whose slices
    are index arrays.  ``sampler_state`` is the flattened state of a stateful
    order sampler right after it produced ``order`` (or ``None``), so that a
    snapshot restores the sampler to the point that matches the position.
    ``padding`` is, for a sharded iterator, how many rows of the batch that
    led here repeat an example to even out the ranks' shares (see
    ``_shard``); never saved.
    """
    current_position: int
    epoch: int
    is_new_epoch: bool
    order: typing.Any
    previous_epoch_detail: float = NO_PREVIOUS_EPOCH_DETAIL
    sampler_state: typing.Optional[dict] = None
    padding: int = 0


class Step:
    """One batch to load: dataset indices, and the epoch and position
    within that epoch's order each was taken from (the key of
    ``example_rng()``), as spans: ``(epoch, start, stop)`` per epoch the
    batch draws from, positions ``start...stop - 1`` in order.

    ``orders`` gives, per span, the order its positions index (None: the
    identity order); ``indices`` are then computed when first asked for, so
    a transport that can send the orders themselves (a ``SeededPermutation``
    is three integers) never computes them in the main process.  Built with
    ``indices`` (and no orders), a step is just those indices.
    """
    __slots__ = ('spans', 'orders', '_indices')

    def __init__(self, indices, spans, orders=None):
        if indices is None and orders is None:
            raise ValueError('a Step needs its indices or its orders')
        self.spans = tuple(spans)
        self.orders = None if orders is None else tuple(orders)
        self._indices = indices

    @property
    def indices(self):
        if self._indices is None:
            parts = [numpy.arange(a, b, dtype=numpy.intp) if order is None
                     else numpy.asarray(order[a:b], dtype=numpy.intp)
                     for (_, a, b), order in zip(self.spans, self.orders)]
            self._indices = parts[0] if len(parts) == 1 else \
                numpy.concatenate(parts) if parts else \
                numpy.zeros(0, dtype=numpy.intp)
        return self._indices

    def __len__(self):
        if self._indices is not None:
            return len(self._indices)
        return sum(b - a for _, a, b in self.spans)

    def __repr__(self):
        return 'Step(spans={!r})'.format(self.spans)

    def cut(self, start, stop):
        """The step of rows ``start...stop - 1``."""
        if self.orders is None:
            return Step(self._indices[start:stop],
                        cut_spans(self.spans, start, stop))
        spans, orders = _cut(self.spans, self.orders, start, stop)
        indices = None if self._indices is None else \
            self._indices[start:stop]
        return Step(indices, spans, orders)

    @staticmethod
    def join(steps):
        """One step of the rows of ``steps``, one after another (spans
        that continue each other in the same order become one)."""
        if len(steps) == 1:
            return steps[0]
        if any(step.orders is None for step in steps):
            spans, _ = _joined(
                (span, None) for step in steps for span in step.spans)
            return Step(numpy.concatenate([step.indices for step in steps]),
                        spans)
        return Step(None, *_joined(
            pair for step in steps for pair in zip(step.spans, step.orders)))

    @property
    def epochs(self):
        return numpy.concatenate(
            [numpy.full(b - a, e, dtype=numpy.int64) for e, a, b in self.spans])

    @property
    def positions(self):
        return numpy.concatenate(
            [numpy.arange(a, b, dtype=numpy.int64) for _, a, b in self.spans])


def _joined(pairs):
    """``(spans, orders)`` from ``(span, order)`` pairs, a span that
    continues the one before it in the same order merged into it."""
    spans, orders = [], []
    for span, order in pairs:
        if spans and orders[-1] is order and spans[-1][0] == span[0] and \
                spans[-1][2] == span[1]:
            spans[-1] = (span[0], spans[-1][1], span[2])
        else:
            spans.append(span)
            orders.append(order)
    return spans, orders


def cut_spans(spans, start, stop):
    """The spans of rows ``start...stop - 1`` of a step with ``spans``."""
    return _cut(spans, (None,) * len(spans), start, stop)[0]


def _cut(spans, orders, start, stop):
    out, kept = [], []
    row = 0
    for (epoch, a, b), order in zip(spans, orders):
        lo, hi = max(start - row, 0), min(stop - row, b - a)
        if lo < hi:
            out.append((epoch, a + lo, a + hi))
            kept.append(order)
        row += b - a
    return tuple(out), tuple(kept)


def epoch_detail(state, dataset_len):
    n = dataset_len if state.order is None else len(state.order)
    return state.epoch + state.current_position / n


def advance(state, batch_size, repeat, dataset_len, next_order):
    """Advance ``state`` by one batch.

    Args:
        state: the current ``IteratorState``.
        batch_size: a positive int.
        repeat: whether the iterator wraps around into further epochs.
        dataset_len: the dataset length (used when ``state.order`` is None).
        next_order: ``next_order(order, position, new_epoch)`` (the order
            and position the epoch ends at) returns ``(order,
            sampler_state)`` for the epoch ``new_epoch``, an order as long
            as the last (it validates what it returns); called only when
            ``state.order`` is not None.

    Returns:
        ``(new_state, step)``, or ``(state, None)`` when a non-repeating
        iterator has finished.
    """
    i, epoch, order = state.current_position, state.epoch, state.order
    sampler_state = state.sampler_state
    n = dataset_len if order is None else len(order)
    if not repeat and (epoch > 0 or n == 0):
        # Chainer sets previous_epoch_detail on the call that stops, too.
        if n:
            state = state._replace(previous_epoch_detail=epoch + i / n)
        return state, None
    if n == 0:
        raise ValueError(
            'cannot iterate over an empty dataset with repeat=True: the '
            'epoch size is 0. Pass a non-empty dataset, or repeat=False.')
    previous = epoch + i / n

    parts = []
    i_end = i + batch_size if repeat else min(i + batch_size, n)
    is_new_epoch = False
    while i_end >= n:
        parts.append((epoch, i, n, order))
        if order is not None:
            order, sampler_state = next_order(order, i, epoch + 1)
        i = 0
        i_end = i_end - n if repeat else 0
        epoch += 1
        is_new_epoch = True
        if not repeat:
            break
    if i_end > i or not parts:
        parts.append((epoch, i, i_end, order))

    # The indices are computed when a transport asks for them.
    spans = tuple((e, a, b) for e, a, b, _ in parts)
    new_state = IteratorState(
        i_end, epoch, is_new_epoch, order, previous, sampler_state)
    return new_state, Step(None, spans, [o for _, _, _, o in parts])


def check_order(order, dataset_len, epoch_size=None):
    """Validate an order produced by an order sampler; return it as an
    immutable intp array.

    An order may have any length (an epoch is ``len(order)`` examples long:
    oversampling, class balancing), but every later epoch's order must be as
    long as the first (``epoch_size``), as in Chainer.
    """
    order = numpy.array(order, dtype=numpy.intp, copy=True)
    if order.ndim != 1:
        raise ValueError(
            'the order sampler returned an order of shape {}; an order '
            'sampler must return a 1-d array of dataset indices'.format(
                order.shape))
    if epoch_size is not None and len(order) != epoch_size:
        raise ValueError(
            'the order sampler returned an order of length {}, but the '
            'previous order had length {}: the size of order must not change '
            'between epochs'.format(len(order), epoch_size))
    if len(order) and (order.min() < 0 or order.max() >= dataset_len):
        raise ValueError(
            'the order sampler returned indices out of range [0, {}): '
            'min {}, max {}'.format(dataset_len, order.min(), order.max()))
    order.flags.writeable = False
    return order
