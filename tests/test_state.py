"""The pure core: advance() alone, no iterator, no threads."""

import numpy
import pytest

from chainiter.iterators._state import (
    IteratorState,
    Step,
    advance,
    cut_spans,
    epoch_detail,
)


def identity_sampler(order, position, epoch):
    return order, None


def reversed_sampler(order, position, epoch):
    return order[::-1].copy(), None


def run(n, batch_size, repeat, steps, order=None, next_order=identity_sampler):
    state = IteratorState(0, 0, False, order)
    out = []
    for _ in range(steps):
        state, step = advance(state, batch_size, repeat, n, next_order)
        if step is None:
            out.append(None)
            break
        out.append((list(step.indices), state.epoch, state.current_position,
                    state.is_new_epoch))
    return out


def test_divisible_repeat():
    assert run(6, 3, True, 3) == [
        ([0, 1, 2], 0, 3, False),
        ([3, 4, 5], 1, 0, True),
        ([0, 1, 2], 1, 3, False),
    ]


def test_wrap_around_fills_from_next_epoch():
    assert run(5, 3, True, 3) == [
        ([0, 1, 2], 0, 3, False),
        ([3, 4, 0], 1, 1, True),
        ([1, 2, 3], 1, 4, False),
    ]


def test_batch_larger_than_dataset_spans_epochs():
    assert run(2, 5, True, 2) == [
        ([0, 1, 0, 1, 0], 2, 1, True),
        ([1, 0, 1, 0, 1], 5, 0, True),
    ]


def test_no_repeat_short_last_batch_then_stop():
    assert run(5, 3, False, 4) == [
        ([0, 1, 2], 0, 3, False),
        ([3, 4], 1, 0, True),
        None,
    ]


def test_no_repeat_exact_end_then_stop():
    assert run(4, 2, False, 4) == [
        ([0, 1], 0, 2, False), ([2, 3], 1, 0, True), None]


def test_no_repeat_empty_dataset_stops_at_once():
    assert run(0, 2, False, 2) == [None]


def test_repeat_empty_dataset_is_an_error():
    with pytest.raises(ValueError, match='empty'):
        run(0, 2, True, 1)


def test_order_sampler_called_at_each_epoch_end():
    order = numpy.array([2, 0, 1])
    assert run(3, 2, True, 3, order=order, next_order=reversed_sampler) == [
        ([2, 0], 0, 2, False),
        ([1, 1], 1, 1, True),   # next epoch's order is [1, 0, 2]
        ([0, 2], 2, 0, True),
    ]


def test_keys_name_epoch_and_position_of_each_example():
    state = IteratorState(3, 0, False, None)
    state, step = advance(state, 4, True, 5, identity_sampler)
    assert list(step.indices) == [3, 4, 0, 1]
    assert list(step.epochs) == [0, 0, 1, 1]
    assert list(step.positions) == [3, 4, 0, 1]
    assert step.spans == ((0, 3, 5), (1, 0, 2))


@pytest.mark.parametrize('start,stop', [(0, 9), (0, 2), (1, 3), (2, 2),
                                        (3, 9), (4, 8), (7, 9)])
def test_cut_spans_keys_the_rows_of_a_chunk(start, stop):
    state = IteratorState(3, 0, False, None)
    state, step = advance(state, 9, True, 5, identity_sampler)  # 3 epochs
    assert step.spans == ((0, 3, 5), (1, 0, 5), (2, 0, 2))
    spans = cut_spans(step.spans, start, stop)
    keys = [(e, p) for e, a, b in spans for p in range(a, b)]
    assert keys == list(zip(step.epochs, step.positions))[start:stop]


def test_epoch_detail_and_previous():
    state = IteratorState(0, 0, False, None)
    state, _ = advance(state, 2, True, 5, identity_sampler)
    assert state.previous_epoch_detail == 0.0
    assert epoch_detail(state, 5) == pytest.approx(0.4)
    state, _ = advance(state, 4, True, 5, identity_sampler)
    assert state.previous_epoch_detail == pytest.approx(0.4)
    assert epoch_detail(state, 5) == pytest.approx(1.2)


def test_state_is_not_mutated():
    order = numpy.array([1, 0, 2])
    state = IteratorState(0, 0, False, order)
    new_state, _ = advance(state, 4, True, 3, reversed_sampler)
    assert state == IteratorState(0, 0, False, order)
    assert list(order) == [1, 0, 2]
    assert new_state.epoch == 1


def _seeded_steps(n, batch_size, steps, start=0):
    from chainiter.iterators.order_samplers import SeededPermutation

    def next_order(order, position, epoch):
        return SeededPermutation(7, epoch, n), None

    state = IteratorState(start, 0, False, SeededPermutation(7, 0, n))
    out = []
    for _ in range(steps):
        state, step = advance(state, batch_size, True, n, next_order)
        out.append(step)
    return out


@pytest.mark.parametrize('n', [11, 70000])   # drawn whole, and a network
def test_a_steps_indices_are_its_orders_at_its_positions(n):
    from chainiter.iterators.order_samplers import seeded_order
    for step in _seeded_steps(n, 2 * n // 3 + 1, 4, start=n - 3):
        expected = numpy.concatenate([seeded_order(7, e, n)[a:b]
                                      for e, a, b in step.spans])
        assert step.indices.tolist() == expected.tolist()
        assert len(step) == len(expected)


@pytest.mark.parametrize('start,stop', [(0, 9), (0, 2), (1, 3), (2, 2),
                                        (3, 9), (4, 8), (7, 9)])
def test_a_cut_step_is_the_rows_of_the_step(start, stop):
    step, = _seeded_steps(5, 9, 1, start=3)      # three epochs
    lazy = step.cut(start, stop)                 # cut before computing
    rows = step.indices[start:stop]
    assert lazy.indices.tolist() == rows.tolist()
    assert lazy.spans == cut_spans(step.spans, start, stop)
    assert step.cut(start, stop).indices.tolist() == rows.tolist()


@pytest.mark.parametrize('n,batch_size,count', [(11, 3, 9), (5, 9, 4),
                                                (70000, 4096, 20)])
def test_joined_steps_are_their_rows_one_after_another(n, batch_size, count):
    steps = _seeded_steps(n, batch_size, count, start=n - 2)
    joined = Step.join(steps)
    assert joined.indices.tolist() == numpy.concatenate(
        [step.indices for step in steps]).tolist()
    assert joined.epochs.tolist() == numpy.concatenate(
        [step.epochs for step in steps]).tolist()
    assert joined.positions.tolist() == numpy.concatenate(
        [step.positions for step in steps]).tolist()
    # Spans that continue each other become one: one per epoch here.
    assert [e for e, _, _ in joined.spans] == sorted(
        {e for step in steps for e, _, _ in step.spans})


def test_joined_steps_of_indices_keep_their_indices_and_positions():
    steps = [Step(numpy.array([5, 1]), [(0, 0, 2)]),
             Step(numpy.array([7]), [(0, 2, 3)]),
             Step(numpy.array([2, 2]), [(1, 0, 2)])]
    joined = Step.join(steps)
    assert joined.orders is None
    assert joined.indices.tolist() == [5, 1, 7, 2, 2]
    assert joined.spans == ((0, 0, 3), (1, 0, 2))
    assert Step.join(steps[:1]) is steps[0]
