"""Where epochs' orders come from, without an iterator: the seeded orders
kept for a few epochs, and an order sampler's state taken and put back."""

import numpy

from chainiter import ShuffleOrderSampler
from chainiter.iterators import _orders, order_samplers


def test_recent_orders_are_computed_once_and_the_oldest_go():
    recent = _orders.RecentOrders(kept=2)
    first = recent.get(5, 0, 10)
    assert recent.get(5, 0, 10) is first
    numpy.testing.assert_array_equal(
        first, order_samplers.SeededPermutation(5, 0, 10))
    recent.get(5, 1, 10)
    recent.get(6, 0, 10)        # a third: the first goes
    assert len(recent) == 2
    assert recent.get(5, 0, 10) is not first


def test_a_samplers_state_is_taken_and_put_back():
    sampler = ShuffleOrderSampler(numpy.random.RandomState(3))
    state = _orders.capture(sampler)
    drawn = sampler(numpy.arange(8), 0)
    _orders.restore(sampler, state)
    numpy.testing.assert_array_equal(sampler(numpy.arange(8), 0), drawn)


def test_a_sampler_without_state_has_none():
    def sampler(order, position):
        return order
    assert _orders.capture(sampler) is None
    _orders.restore(sampler, None)      # nothing to do
