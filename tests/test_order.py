"""The seeded order: a permutation computed position by position, so that
memory, snapshots and epoch boundaries do not grow with the dataset."""

import io
import pickle

import numpy
import pytest

import chainiter
from chainiter import MultithreadIterator, SerialIterator
from chainiter.iterators.order_samplers import (
    MATERIALIZED_MAX,
    SeededPermutation,
    seeded_order,
)
from chainiter.serializers import load_npz, save_npz


class Huge:
    """A dataset of ``n`` examples, example ``i`` being ``i``: no storage."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return int(i)


@pytest.mark.parametrize('n', list(range(0, 40)) + [
    99, 100, 101, 1023, 1024, 4097, 65536, 65537, 65793, 99991, 262147])
def test_is_a_permutation_and_slices_agree(n):
    perm = SeededPermutation(5, 3, n)
    whole = numpy.asarray(perm)
    assert len(perm) == n
    assert numpy.array_equal(numpy.sort(whole), numpy.arange(n))
    # Read in batches of 7, as an iterator does, across the cached blocks.
    reader = SeededPermutation(5, 3, n)
    pieces = [reader[a:a + 7] for a in range(0, n, 7)]
    assert numpy.array_equal(
        numpy.concatenate(pieces) if pieces else whole, whole)
    if n:
        assert perm[-1] == whole[-1] and perm[n // 2] == whole[n // 2]
        assert numpy.array_equal(perm[1::3], whole[1::3])


def test_is_a_pure_function_of_seed_and_epoch():
    a = seeded_order(1, 0, 1000)
    assert numpy.array_equal(a, seeded_order(1, 0, 1000))
    assert not numpy.array_equal(a, seeded_order(1, 1, 1000))
    assert not numpy.array_equal(a, seeded_order(2, 0, 1000))
    perm = SeededPermutation(1, 0, 1000)
    assert numpy.array_equal(pickle.loads(pickle.dumps(perm))[:], a)
    assert perm == SeededPermutation(1, 0, 1000) != SeededPermutation(1, 1, 1000)


def test_positions_out_of_range_are_an_error():
    perm = SeededPermutation(0, 0, 10)
    with pytest.raises(IndexError):
        perm[10]
    with pytest.raises(IndexError):
        perm.take([3, 10])


def test_orders_look_uniform():
    # Beyond MATERIALIZED_MAX the order comes from the keyed network: over
    # many epochs, the pair at positions (0, 1), each binned in tenths of
    # the dataset, must cover the 100 cells evenly (chi-square, 99 degrees
    # of freedom: 170 is far beyond the 99.99th percentile, about 150).
    n, epochs, bins = MATERIALIZED_MAX + 34467, 4000, 10
    assert n > MATERIALIZED_MAX
    pairs = numpy.array([SeededPermutation(11, e, n).take([0, 1])
                         for e in range(epochs)]) * bins // n
    counts = numpy.bincount(pairs[:, 0] * bins + pairs[:, 1],
                            minlength=bins * bins)
    expected = epochs / bins ** 2
    assert ((counts - expected) ** 2 / expected).sum() < 170
    # Neighbouring positions are not correlated, nor positions and indices.
    big = numpy.asarray(SeededPermutation(3, 0, 200003)).astype(float)
    assert abs(numpy.corrcoef(big[:-1], big[1:])[0, 1]) < 0.02
    assert abs(numpy.corrcoef(numpy.arange(len(big)), big)[0, 1]) < 0.02


def test_large_orders_stay_what_snapshots_were_taken_with():
    # A snapshot holds (seed, epoch, position), not the order: the keyed
    # network must give the same indices in every version, however it is
    # computed.
    assert SeededPermutation(7, 2, 10 ** 6)[:8].tolist() == [
        67364, 713984, 365511, 76499, 314947, 923000, 885489, 895960]
    assert SeededPermutation(7, 2, 10 ** 9 + 7).take(
        [0, 1, 10 ** 9 + 6, 123456789]).tolist() == [
        655002402, 141514102, 585281041, 40668421]


def test_small_orders_are_numpy_shuffles():
    # Up to MATERIALIZED_MAX an epoch's order is numpy's permutation,
    # drawn whole (exactly uniform; small datasets cross epochs often).
    expected = numpy.random.Generator(numpy.random.PCG64(
        numpy.random.SeedSequence([5, 0, 2]))).permutation(1000)
    assert numpy.array_equal(seeded_order(5, 2, 1000), expected)


def test_snapshot_size_does_not_grow_with_the_dataset():
    sizes = []
    for n in (10, 10 ** 9):
        with SerialIterator(Huge(n), 4, seed=0) as it:
            next(it)
            state = it.state_dict()
            assert 'order' not in state and state['seeded_order']
            assert all(numpy.ndim(value) == 0 for value in state.values())
            f = io.BytesIO()
            save_npz(f, it)
            sizes.append(len(f.getvalue()))
    assert sizes[1] - sizes[0] < 64 and sizes[1] < 8192, sizes


def test_epoch_boundary_of_a_billion_examples():
    # Building the iterator, crossing an epoch boundary and resuming take
    # no array of a billion indices (8 GB): each would run out of time.
    n = 10 ** 9
    with SerialIterator(Huge(n), 4, seed=1) as it:
        state = it.state_dict()
        state['current_position'] = n - 2
        it.load_state_dict(state)
        batch = next(it)
        assert it.is_new_epoch and it.epoch == 1
        assert batch[:2] == [int(i) for i in SeededPermutation(1, 0, n)[-2:]]
        assert batch[2:] == [int(i) for i in SeededPermutation(1, 1, n)[:2]]
        after = it.state_dict()
        expected = [next(it) for _ in range(3)]
    with MultithreadIterator(Huge(n), 4, seed=99, n_threads=2) as other:
        other.load_state_dict(after)
        assert [next(other) for _ in range(3)] == expected


def test_save_order_writes_the_order_chainer_needs():
    dataset = list(range(10))
    with SerialIterator(dataset, 3, seed=4) as it:
        next(it)
        it.save_order = True
        f = io.BytesIO()
        save_npz(f, it)
        expected = [next(it) for _ in range(5)]
    f.seek(0)
    with numpy.load(f) as npz:
        stored = dict(npz)
    assert numpy.array_equal(stored['order'], seeded_order(4, 0, 10))
    # As Chainer would read it (no seeded_order, no seed): the epoch in
    # progress continues in the stored order.
    chainer_keys = {key: stored[key] for key in (
        'current_position', 'epoch', 'is_new_epoch', 'order',
        'previous_epoch_detail')}
    g = io.BytesIO()
    numpy.savez(g, **chainer_keys)
    g.seek(0)
    with SerialIterator(dataset, 3, seed=77) as other:
        load_npz(g, other)
        assert next(other) == expected[0] and next(other) == expected[1]
    # And into chainiter, the whole snapshot resumes exactly.
    f.seek(0)
    with SerialIterator(dataset, 3) as again:
        load_npz(f, again)
        assert [next(again) for _ in range(5)] == expected


def test_order_that_contradicts_the_seed_is_refused():
    with SerialIterator(list(range(10)), 3, seed=4) as it:
        next(it)
        it.save_order = True
        state = it.state_dict()
    state['order'] = state['order'][::-1].copy()
    with SerialIterator(list(range(10)), 3, seed=4) as other:
        before = other.state_dict()
        with pytest.raises(chainiter.SnapshotMismatchError,
                           match='not the one its seed gives'):
            other.load_state_dict(state)
        assert other.state_dict() == before


def test_seeded_snapshot_into_an_order_sampler_iterator_is_refused():
    with SerialIterator(list(range(10)), 3, seed=4) as it:
        state = it.state_dict()
    sampler = chainiter.iterators.ShuffleOrderSampler(
        numpy.random.RandomState(0))
    with SerialIterator(list(range(10)), 3, order_sampler=sampler) as other:
        with pytest.raises(chainiter.SnapshotMismatchError,
                           match='uses an order_sampler'):
            other.load_state_dict(state)
    with SerialIterator(list(range(10)), 3, shuffle=False) as other:
        with pytest.raises(chainiter.SnapshotMismatchError,
                           match='does not shuffle'):
            other.load_state_dict(state)


def test_old_snapshot_with_an_order_resumes_then_follows_the_seed():
    # A snapshot of format 2 (or Chainer's) holds the epoch's order: that
    # epoch finishes in it, the next ones follow the seed.
    order = numpy.array([3, 1, 4, 0, 5, 2, 6, 7, 9, 8])
    state = {'format_version': 2, 'current_position': 6, 'epoch': 2,
             'is_new_epoch': False, 'order': order,
             'previous_epoch_detail': 2.3, 'seed': 12, 'reset_count': 0,
             'dataset_length': 10}
    with SerialIterator(list(range(10)), 2) as it:
        it.load_state_dict(state)
        assert next(it) == [6, 7] and next(it) == [9, 8]
        assert next(it) == [int(i) for i in seeded_order(12, 3, 10)[:2]]
        resumed = it.state_dict()
        assert 'order' not in resumed and resumed['epoch'] == 3
