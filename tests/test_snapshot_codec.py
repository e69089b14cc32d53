"""The snapshot codec, driven without an iterator: ``save`` writes the
fields of a state, ``read`` checks them against the iterator that loads
them and returns what it found, changing nothing."""

import numpy
import pytest

from chainiter import SnapshotMismatchError
from chainiter.iterators import _snapshot, _state, order_samplers
from chainiter.serializers.npz import DictionarySerializer, NpzDeserializer

SEEDED = _snapshot.Target(dataset_length=6, shuffle=True, sampler=False,
                          global_batch_size=2)
SAMPLED = SEEDED._replace(shuffle=False, sampler=True)
PLAIN = SEEDED._replace(shuffle=False)


def saved(state, seed=7, resets=0, n=6, **shard):
    serializer = DictionarySerializer()
    _snapshot.save(serializer, state, seed, resets, n, **shard)
    return dict(serializer.target)


def read(fields, target=SEEDED):
    return _snapshot.read(NpzDeserializer(fields), target)


def as_chainers(fields):
    """``fields`` with only the keys Chainer's iterators write."""
    return {key: value for key, value in fields.items() if key in (
        'current_position', 'epoch', 'is_new_epoch', 'order',
        'previous_epoch_detail')}


def seeded_state(seed=7, resets=0, epoch=1, position=4):
    order = order_samplers.SeededPermutation(
        order_samplers.pass_seed(seed, resets), epoch, 6)
    return _state.IteratorState(position, epoch, False, order, 1.5)


def test_a_seeded_order_is_named_not_stored_and_read_back():
    fields = saved(seeded_state(resets=2), resets=2)
    assert 'order' not in fields and bool(fields['seeded_order'])
    assert int(fields['format_version']) == _snapshot.FORMAT_VERSION
    snapshot = read(fields)
    assert (snapshot.seed, snapshot.resets) == (7, 2)
    state = snapshot.state
    assert (state.current_position, state.epoch, state.is_new_epoch,
            state.previous_epoch_detail) == (4, 1, False, 1.5)
    assert isinstance(state.order, order_samplers.SeededPermutation)
    numpy.testing.assert_array_equal(state.order,
                                     seeded_state(resets=2).order)
    assert state.sampler_state is None


def test_an_order_samplers_order_is_stored_and_read_back():
    order = numpy.array([5, 4, 3, 2, 1, 0, 5])     # longer than the data
    fields = saved(_state.IteratorState(3, 0, False, order, 0.25))
    numpy.testing.assert_array_equal(read(fields, SAMPLED).state.order,
                                     order)


def test_read_changes_nothing_and_gives_the_same_value_twice():
    fields = saved(seeded_state())
    before = {key: numpy.copy(value) for key, value in fields.items()}
    first, second = read(fields), read(fields)
    assert first.state[:3] == second.state[:3]
    assert fields.keys() == before.keys()
    for key in fields:
        numpy.testing.assert_array_equal(fields[key], before[key])


@pytest.mark.parametrize('epoch, position, expected', [
    (1, 4, 1 + 2 / 6),      # one global batch of 2 back
    (1, 0, 1 - 2 / 6),
    (0, 1, 0.0),            # not before the start
    (0, 0, _state.NO_PREVIOUS_EPOCH_DETAIL),
])
@pytest.mark.parametrize('layout', [as_chainers, dict],
                         ids=['chainers', 'chainiters'])
def test_previous_epoch_detail_is_guessed_as_chainer_does(
        epoch, position, expected, layout):
    # Chainer's test of old snapshots deletes it from what chainiter's
    # iterator wrote, too.
    fields = layout(saved(_state.IteratorState(position, epoch, False,
                                               None)))
    del fields['previous_epoch_detail']
    assert read(fields, PLAIN).state.previous_epoch_detail == \
        pytest.approx(expected)


def test_shard_fields_are_written_and_checked_for_sense():
    fields = saved(seeded_state(), shard_size=2, global_batch_size=4)
    assert (int(fields['shard_size']), int(fields['global_batch_size'])) \
        == (2, 4)
    read(fields)        # elastic: any other global batch loads it
    del fields['global_batch_size']
    with pytest.raises(SnapshotMismatchError, match="has 'shard_size' but "
                       "not 'global_batch_size'"):
        read(fields)
    fields.update(global_batch_size=5)
    with pytest.raises(SnapshotMismatchError, match='global_batch_size 5'):
        read(fields)


def test_a_sharded_iterators_seed_must_match():
    fields = saved(seeded_state())
    assert read(fields, SEEDED._replace(pinned_seed=7)).seed == 7
    with pytest.raises(SnapshotMismatchError, match='written with seed 7'):
        read(fields, SEEDED._replace(pinned_seed=8))


def test_a_seeded_order_needs_its_seed_and_must_be_the_seeds():
    fields = saved(seeded_state())
    fields['order'] = numpy.arange(6)
    with pytest.raises(SnapshotMismatchError, match='corrupt'):
        read(fields)
    del fields['order'], fields['seed']
    with pytest.raises(SnapshotMismatchError, match="has no 'seed'"):
        read(fields)


@pytest.mark.parametrize('target, message', [
    (PLAIN, 'does not shuffle'),
    (SAMPLED, 'uses an order_sampler'),
])
def test_a_seeded_snapshot_needs_a_seeded_shuffle(target, message):
    with pytest.raises(SnapshotMismatchError, match=message):
        read(saved(seeded_state()), target)


def test_a_newer_format_and_another_dataset_length_are_refused():
    fields = saved(seeded_state())
    with pytest.raises(SnapshotMismatchError, match='dataset of length 6'):
        read(fields, SEEDED._replace(dataset_length=7))
    fields['format_version'] = _snapshot.FORMAT_VERSION + 1
    with pytest.raises(SnapshotMismatchError, match='upgrade chainiter'):
        read(fields)


def test_missing_field_names_the_path_hint():
    fields = as_chainers(saved(seeded_state(), resets=0))
    fields['order'] = numpy.asarray(seeded_state().order)
    del fields['epoch']
    with pytest.raises(SnapshotMismatchError, match="no 'epoch'.*path="):
        read(fields)


@pytest.mark.parametrize('key', _snapshot.WRITTEN_BY_EVERY[3])
def test_a_field_every_snapshot_of_its_version_holds_is_required(key):
    fields = saved(seeded_state())
    del fields[key]
    with pytest.raises(SnapshotMismatchError,
                       match="format version 3.* no {!r}".format(key)):
        read(fields)


@pytest.mark.parametrize('key', _snapshot.CHAINITER_FIELDS)
def test_a_field_only_chainiter_writes_needs_a_format_version(key):
    fields = saved(seeded_state(), shard_size=2, global_batch_size=4)
    del fields['format_version']
    fields = {k: v for k, v in fields.items()
              if k == key or k not in _snapshot.CHAINITER_FIELDS}
    with pytest.raises(SnapshotMismatchError,
                       match="has {!r} but no 'format_version'".format(key)):
        read(fields)


@pytest.mark.parametrize('version, absent', [
    (1, ('reset_count', 'seeded_order')), (2, ('seeded_order',))])
def test_older_formats_need_only_the_fields_they_wrote(version, absent):
    fields = saved(seeded_state(), resets=0)
    fields['format_version'] = numpy.asarray(version)
    fields['order'] = numpy.asarray(seeded_state().order)
    for key in absent:
        del fields[key]
    snapshot = read(fields)
    assert (snapshot.version, snapshot.resets, snapshot.seed) == \
        (version, 0, 7)
    numpy.testing.assert_array_equal(snapshot.state.order,
                                     seeded_state().order)


def test_a_chainer_snapshot_needs_no_seed_and_no_format_version():
    snapshot = read(as_chainers(dict(
        saved(seeded_state()), order=numpy.asarray(seeded_state().order))))
    assert (snapshot.version, snapshot.seed, snapshot.resets) == \
        (None, None, 0)


@pytest.mark.parametrize('version, held, holds', [
    (None, (), False),            # Chainer's: no sampler state
    (3, ('keys', 'pos'), True),
])
def test_an_order_samplers_state_is_held_whole(version, held, holds):
    state = {'keys': numpy.arange(3), 'pos': 1}
    fields = {'order_sampler/' + key: numpy.asarray(state[key])
              for key in held}
    sampler = object()
    assert _snapshot.holds_sampler_state(
        NpzDeserializer(fields)['order_sampler'], state, version,
        sampler) is holds


@pytest.mark.parametrize('version, held, missing', [
    (None, ('keys',), 'pos'),     # a part of it: lost on the way
    (3, ('keys',), 'pos'),
    (3, (), 'keys'),              # none, in a snapshot of chainiter's
])
def test_an_order_samplers_state_in_part_is_refused(version, held, missing):
    state = {'keys': numpy.arange(3), 'pos': 1}
    fields = {'order_sampler/' + key: numpy.asarray(state[key])
              for key in held}
    with pytest.raises(SnapshotMismatchError,
                       match="no 'order_sampler/{}'".format(missing)):
        _snapshot.holds_sampler_state(
            NpzDeserializer(fields)['order_sampler'], state, version,
            object())


@pytest.mark.parametrize('chainer_order, chainers, key, none', [
    (('order', False), False, 'order', False),
    (('_order', True), False, '_order', False),
    (('_order', True), True, '_order', True),
])
def test_as_chainer_writes_writes_the_seeded_order_out(
        chainer_order, chainers, key, none):
    fields = saved(seeded_state(resets=1), resets=1)
    items = _snapshot.as_chainer_writes(fields, chainer_order, chainers)
    numpy.testing.assert_array_equal(items[key],
                                     seeded_state(resets=1).order)
    assert fields.keys() == saved(seeded_state()).keys()  # not changed
    plain = saved(_state.IteratorState(0, 0, False, None))
    items = _snapshot.as_chainer_writes(plain, chainer_order, chainers)
    assert (key in items and items[key] is None) == none


def test_serializers_are_told_apart():
    assert _snapshot.is_deserializer(NpzDeserializer({}))
    assert not _snapshot.is_deserializer(DictionarySerializer())
    assert not _snapshot.is_chainers(DictionarySerializer())
