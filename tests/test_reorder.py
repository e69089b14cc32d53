import random

import pytest

from chainiter.iterators.pipeline.flow.reorder import Reorderer


@pytest.mark.parametrize('seed', range(5))
def test_shuffled_arrivals_leave_in_order(seed):
    arrivals = list(range(50))
    random.Random(seed).shuffle(arrivals)
    reorderer = Reorderer()
    released = []
    for seq in arrivals:
        released.extend(reorderer.push(seq, 'item{}'.format(seq)))
        assert released == ['item{}'.format(i) for i in range(len(released))]
    assert len(released) == 50 and len(reorderer) == 0


def test_holds_until_the_gap_is_filled():
    reorderer = Reorderer(next_seq=3)
    assert reorderer.push(4, 'b') == []
    assert reorderer.push(5, 'c') == []
    assert reorderer.push(3, 'a') == ['a', 'b', 'c']
    assert reorderer.next_seq == 6


def test_reset_drops_stored_items():
    reorderer = Reorderer()
    reorderer.push(1, 'stale')
    reorderer.reset(10)
    assert len(reorderer) == 0
    assert reorderer.push(10, 'fresh') == ['fresh']


def test_duplicate_is_an_error():
    reorderer = Reorderer()
    reorderer.push(0, 'a')
    with pytest.raises(ValueError):
        reorderer.push(0, 'a')
