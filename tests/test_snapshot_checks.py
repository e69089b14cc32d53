"""Snapshots that do not fit: a clear SnapshotMismatchError naming the
field, and the iterator left exactly as it was.  Snapshots as frameworks
keep them: a fresh iterator's state dict has the structure of every later
one, and one that lost a key resumes exactly or names the key."""

import functools
import io

import numpy
import pytest

import chainiter
from chainiter import (
    MultiprocessIterator,
    MultithreadIterator,
    SerialIterator,
    ShuffleOrderSampler,
    SnapshotMismatchError,
)
from chainiter.serializers import load_npz, save_npz

from helpers import AugmentedDataset, fingerprint, through_json


def good_state():
    with SerialIterator(AugmentedDataset(6), 4, seed=11) as it:
        next(it)
        next(it)
        return it.state_dict()


BAD = [
    ('current_position', 1.5, 'current_position must be an integer'),
    ('current_position', numpy.arange(2), 'current_position must be a single'),
    ('current_position', 'x', 'current_position must be an integer'),
    ('current_position', 99, 'does not fit'),
    ('epoch', -1, 'does not fit'),
    ('epoch', 2.0 ** 70, 'epoch must be an integer'),
    ('is_new_epoch', 3, 'is_new_epoch must be a bool'),
    ('seed', -5, 'seed'),
    ('seed', 1.25, 'seed must be an integer'),
    ('reset_count', -1, 'reset_count'),
    ('previous_epoch_detail', float('nan'), 'previous_epoch_detail'),
    ('order', numpy.arange(6.0), 'order must be a 1-d array of integers'),
    ('order', numpy.ones(6, dtype=bool), 'order must be a 1-d array of int'),
    ('order', numpy.arange(6).reshape(2, 3), 'order must be a 1-d array'),
    ('order', numpy.array([0, 1, 2, 3, 4, 4]), 'repeats indices'),
    ('order', numpy.array([0, 1, 2, 3, 4, 6]), 'out of range'),
    ('order', numpy.array([0, 1, 2, 3, 4, -1]), 'out of range'),
    ('format_version', 'v1', 'format_version must be an integer'),
]


@pytest.mark.parametrize('key, value, message', BAD,
                         ids=['{}={!r}'.format(k, v)[:40] for k, v, _ in BAD])
def test_malformed_field_is_named_and_nothing_changes(key, value, message):
    state = good_state()
    state[key] = value
    with SerialIterator(AugmentedDataset(6), 4, seed=3) as it:
        next(it)
        before = it.state_dict()
        with pytest.raises(SnapshotMismatchError, match=message):
            it.load_state_dict(state)
        after = it.state_dict()
        assert after.keys() == before.keys()
        for k in before:
            numpy.testing.assert_array_equal(after[k], before[k])
        expected = fingerprint(next(it))
    with SerialIterator(AugmentedDataset(6), 4, seed=3) as ref:
        next(ref)
        assert fingerprint(next(ref)) == expected


def test_failed_load_keeps_the_seed_and_the_stream():
    # The seed field is fine, a later one is not: the old seed stays.
    state = good_state()
    state['previous_epoch_detail'] = 'oops'
    with MultithreadIterator(AugmentedDataset(6), 4, seed=3) as it:
        with pytest.raises(SnapshotMismatchError):
            it.load_state_dict(state)
        assert it.seed == 3
        got = [fingerprint(next(it)) for _ in range(3)]
    with SerialIterator(AugmentedDataset(6), 4, seed=3) as ref:
        assert got == [fingerprint(next(ref)) for _ in range(3)]


def test_failed_load_leaves_the_order_sampler_as_it_was():
    with SerialIterator(list(range(6)), 4, order_sampler=ShuffleOrderSampler(
            numpy.random.RandomState(1))) as source:
        state = source.state_dict()
    state['order_sampler/keys'] = numpy.arange(3)      # wrong shape
    sampler = ShuffleOrderSampler(numpy.random.RandomState(2))
    with SerialIterator(list(range(6)), 4, order_sampler=sampler) as it:
        random_state = sampler._random.get_state()[1].copy()
        with pytest.raises(SnapshotMismatchError, match='order_sampler'):
            it.load_state_dict(state)
        numpy.testing.assert_array_equal(sampler._random.get_state()[1],
                                         random_state)


def test_unsupported_compression_in_a_damaged_file():
    f = io.BytesIO()
    with SerialIterator(list(range(6)), 4, seed=1) as it:
        save_npz(f, it, compression=False)
    data = bytearray(f.getvalue())
    # Mark every member as compressed with a method zipfile lacks.
    for signature, offset in ((b'PK\x03\x04', 8), (b'PK\x01\x02', 10)):
        start = 0
        while True:
            start = data.find(signature, start)
            if start < 0:
                break
            data[start + offset:start + offset + 2] = (99).to_bytes(2, 'little')
            start += 4
    with SerialIterator(list(range(6)), 4, seed=1) as it:
        with pytest.raises(SnapshotMismatchError):
            load_npz(io.BytesIO(bytes(data)), it)


@pytest.mark.parametrize('timeout', [-1, 0, float('nan'), 'soon', True])
def test_bad_dataset_timeout_is_refused_before_any_worker(timeout):
    with pytest.raises(ValueError, match='dataset_timeout'):
        chainiter.MultiprocessIterator([1, 2], 1, n_processes=1,
                                       dataset_timeout=timeout)


def test_dataset_timeout_none_means_no_warning():
    with chainiter.MultiprocessIterator([1, 2], 1, n_processes=1,
                                        dataset_timeout=None,
                                        shuffle=False) as it:
        assert next(it) == [1]


# ---- snapshots as frameworks keep them ------------------------------------

#: The iterator's arguments for each way of ordering, given its seed.
ORDERINGS = {
    'plain': lambda seed: dict(shuffle=False, seed=seed),
    'seeded': lambda seed: dict(seed=seed),
    'sampler': lambda seed: dict(order_sampler=ShuffleOrderSampler(
        numpy.random.RandomState(seed)), seed=seed),
    # Every rank of a sharded run is built with the run's seed.
    'sharded': lambda seed: dict(seed=7, shard=(1, 2)),
    'no-repeat': lambda seed: dict(seed=seed, repeat=False),
}


def _structure(state):
    return {key: (type(value), numpy.shape(value),
                  getattr(value, 'dtype', None))
            for key, value in state.items()}


def _structures_along_a_run(it):
    """The structure of the state dict before the first batch, then after
    batches across epoch ends, a reset and the end of a pass."""
    yield _structure(it.state_dict())
    for _ in range(2):
        for _ in range(7):
            try:
                next(it)
            except StopIteration:
                pass
            yield _structure(it.state_dict())
        it.reset()
        yield _structure(it.state_dict())


@pytest.mark.parametrize('ordering', sorted(ORDERINGS))
def test_a_fresh_state_dict_has_every_key_of_a_later_one(make, ordering):
    # PyTorch's distributed checkpoint asks a fresh object for the
    # structure of its state before it loads into it.
    with make(AugmentedDataset(10), 4, **ORDERINGS[ordering](7)) as it:
        structures = list(_structures_along_a_run(it))
    assert all(s == structures[0] for s in structures), structures


@pytest.mark.parametrize('ordering', sorted(ORDERINGS))
def test_a_fresh_state_dict_has_every_key_of_a_later_one_multiprocess(
        method, ordering):
    with MultiprocessIterator(AugmentedDataset(10), 4, n_processes=1,
                              start_method=method,
                              **ORDERINGS[ordering](7)) as it:
        structures = list(_structures_along_a_run(it))
    assert all(s == structures[0] for s in structures), structures


@pytest.mark.parametrize('ordering', sorted(ORDERINGS))
def test_a_fresh_state_dict_has_every_key_of_a_later_one_prefetched(
        ordering):
    with chainiter.DevicePrefetcher(SerialIterator(
            AugmentedDataset(10), 4, **ORDERINGS[ordering](7))) as it:
        structures = list(_structures_along_a_run(it))
    assert all(s == structures[0] for s in structures), structures


def _rest(it, n=6):
    """Up to ``n`` more batches, as fingerprints."""
    out = []
    for _ in range(n):
        try:
            out.append(fingerprint(next(it)))
        except StopIteration:
            break
    return out


def _assert_every_lost_key_resumes_or_is_named(make, ordering, via):
    """A state dict taken mid-epoch after a reset, without one of its keys
    (through ``via``): each loads into a fresh iterator (built with another
    seed and another sampler state) and resumes exactly, or raises a
    SnapshotMismatchError that names the key lost."""
    dataset = AugmentedDataset(10)
    with make(dataset, 4, **ORDERINGS[ordering](7)) as it:
        next(it)
        it.reset()
        for _ in range(1 if ordering == 'no-repeat' else 3):
            next(it)
        state = via(it.state_dict())
        expected = _rest(it)
    with make(dataset, 4, **ORDERINGS[ordering](8)) as target:
        target.load_state_dict(state)       # whole, it resumes
        assert _rest(target) == expected
    named, problems = [], []
    for key in state:
        lost = {k: v for k, v in state.items() if k != key}
        with make(dataset, 4, **ORDERINGS[ordering](8)) as target:
            try:
                target.load_state_dict(lost)
            except SnapshotMismatchError as e:
                if repr(key) in str(e):
                    named.append(key)
                else:
                    problems.append('without {!r}: {}'.format(key, e))
                continue
            if _rest(target) != expected:
                problems.append('without {!r} it resumed elsewhere'.format(
                    key))
    assert not problems, problems
    return named


@pytest.mark.parametrize('via', [dict, through_json], ids=['dict', 'json'])
@pytest.mark.parametrize('ordering', sorted(ORDERINGS))
def test_a_state_dict_that_lost_a_key_resumes_exactly_or_names_it(
        make, ordering, via):
    named = _assert_every_lost_key_resumes_or_is_named(make, ordering, via)
    assert 'current_position' in named


@pytest.mark.parametrize('ordering', ['seeded', 'sampler'])
def test_a_state_dict_that_lost_a_key_multiprocess(method, ordering):
    make = functools.partial(MultiprocessIterator, n_processes=1,
                             start_method=method)
    named = _assert_every_lost_key_resumes_or_is_named(make, ordering, dict)
    assert {'reset_count', 'seed'} <= set(named)


def test_a_value_that_does_not_convert_losslessly_is_named():
    with SerialIterator(list(range(6)), 4, order_sampler=ShuffleOrderSampler(
            numpy.random.RandomState(1))) as source:
        state = through_json(source.state_dict())
    for bad in (-1, 2 ** 32, 0.5):
        state['order_sampler/keys'][0] = bad
        with SerialIterator(list(range(6)), 4, order_sampler=(
                ShuffleOrderSampler(numpy.random.RandomState(2)))) as it:
            with pytest.raises(SnapshotMismatchError,
                               match="'order_sampler/keys'.*{}".format(
                                   bad)):
                it.load_state_dict(state)


def test_an_empty_order_through_json_loads():
    # json gives [] back as an empty float64 array.
    def make():
        return SerialIterator([], 2, repeat=False, order_sampler=(
            ShuffleOrderSampler(numpy.random.RandomState(0))))
    with make() as source:
        state = through_json(source.state_dict())
    assert state['order'] == []
    with make() as it:
        it.load_state_dict(state)
        assert list(it) == []
        assert it.state_dict()['order'].dtype.kind == 'i'


class _RemembersNone(chainiter.ShuffleOrderSampler):
    """An order sampler with a field it holds as None."""

    def __init__(self):
        super().__init__(numpy.random.RandomState(0))
        self.last = None

    def serialize(self, serializer):
        super().serialize(serializer)
        self.last = serializer('last', self.last)


def test_an_order_samplers_field_that_is_none_loads(make):
    it = make(list(range(10)), 3, order_sampler=_RemembersNone())
    next(it)
    state = it.state_dict()
    expected = [next(it) for _ in range(5)]
    again = make(list(range(10)), 3, order_sampler=_RemembersNone())
    again.load_state_dict(state)
    assert [next(again) for _ in range(5)] == expected
