"""Snapshots restore exactly: into any kind, after any step."""

import functools
import io
import pathlib

import numpy
import pytest

import chainiter
from chainiter import MultiprocessIterator, MultithreadIterator, SerialIterator
from chainiter.serializers import load_npz, save_npz

from helpers import AugmentedDataset, assert_resume_equivalent, take

KINDS = [
    SerialIterator,
    functools.partial(MultithreadIterator, n_threads=1),
    functools.partial(MultithreadIterator, n_threads=4),
]
KIND_IDS = ['serial', 'thread1', 'thread4']

# 23 examples, batch 5: 3 epochs take 14 batches, with wrap-around batches.
N, BATCH, STEPS = 23, 5, 14


@pytest.mark.parametrize('source', KINDS, ids=KIND_IDS)
@pytest.mark.parametrize('shuffle', [True, False])
def test_resume_equivalence(source, shuffle):
    dataset = AugmentedDataset(N)

    def factory(kind, seed):
        return lambda: kind(dataset, BATCH, shuffle=shuffle, seed=seed)
    # Targets are built with another seed: the snapshot's seed must win.
    assert_resume_equivalent(
        factory(source, 7), [factory(kind, 8) for kind in KINDS], STEPS)


@pytest.mark.parametrize('shuffle', [True, False])
def test_resume_equivalence_multiprocess(method, shuffle):
    # The same matrix for MultiprocessIterator under each start method, as
    # source and as target (fewer steps: every target starts workers).
    dataset = AugmentedDataset(N)
    mp = functools.partial(MultiprocessIterator, n_processes=2,
                           n_prefetch=2, start_method=method)

    def factory(kind, seed):
        return lambda: kind(dataset, BATCH, shuffle=shuffle, seed=seed)
    assert_resume_equivalent(
        factory(mp, 7), [factory(SerialIterator, 8), factory(mp, 8)], 8)


@pytest.mark.parametrize('source', KINDS, ids=KIND_IDS)
def test_resume_equivalence_with_stateful_order_sampler(source):
    dataset = AugmentedDataset(N)

    def factory(kind, seed):
        return lambda: kind(dataset, BATCH, seed=seed,
                            order_sampler=chainiter.ShuffleOrderSampler(
                                numpy.random.RandomState(seed)))
    assert_resume_equivalent(
        factory(source, 7), [factory(kind, 8) for kind in KINDS], STEPS)


@pytest.mark.parametrize('source', KINDS, ids=KIND_IDS)
def test_resume_equivalence_no_repeat(source):
    dataset = AugmentedDataset(N)

    def factory(kind):
        return lambda: kind(dataset, BATCH, repeat=False, seed=3)
    assert_resume_equivalent(factory(source), [factory(k) for k in KINDS], 5)


def test_snapshot_attributes_round_trip():
    with SerialIterator(list(range(10)), 3, seed=1) as it:
        for _ in range(4):
            next(it)
        state = it.state_dict()
        with SerialIterator(list(range(10)), 3) as other:
            other.load_state_dict(state)
            for name in ('epoch', 'current_position', 'is_new_epoch',
                         'epoch_detail', 'previous_epoch_detail', 'seed'):
                assert getattr(other, name) == getattr(it, name), name


def test_state_dict_is_plain_ints_and_arrays():
    with SerialIterator(list(range(10)), 3, seed=1) as it:
        next(it)
        state = it.state_dict()
    assert state['current_position'] == 3 and state['epoch'] == 0
    for value in state.values():
        assert isinstance(value, (int, float, bool, numpy.ndarray))
        if isinstance(value, numpy.ndarray):
            assert value.dtype != object


def test_npz_snapshot_loads_without_pickle(tmp_path):
    path = str(tmp_path / 'snap.npz')
    with SerialIterator(list(range(10)), 3, seed=1) as it:
        next(it)
        save_npz(path, it)
    with numpy.load(path, allow_pickle=False) as npz:
        keys = set(npz.files)
        assert all(npz[key].dtype != object for key in keys)
    assert {'current_position', 'epoch', 'is_new_epoch', 'seeded_order',
            'previous_epoch_detail', 'format_version', 'seed'} <= keys
    assert 'order' not in keys      # it follows from the seed


def test_prefetched_batches_are_not_in_the_snapshot():
    dataset = list(range(12))
    with MultithreadIterator(dataset, 3, shuffle=False) as it:
        next(it)   # batch 1 is now loading ahead
        assert it.state_dict()['current_position'] == 3
        assert it.current_position == 3


def test_snapshot_inside_trainer_path(tmp_path):
    path = str(tmp_path / 'snap.npz')
    with SerialIterator(list(range(10)), 3, seed=1) as it:
        target = {}
        it.serialize(chainiter.serializers.DictionarySerializer(
            target, 'updater/iterator:main/'))
        numpy.savez(path, **target)
        expected = take(it, 3)
    with SerialIterator(list(range(10)), 3) as other:
        load_npz(path, other, path='updater/iterator:main/')
        assert take(other, 3) == expected


def chainer_snapshot(order_key='order', previous=True, **overrides):
    """An npz file with exactly the keys Chainer 7's save_npz writes for a
    SerialIterator or MultiprocessIterator."""
    values = {
        'current_position': numpy.asarray(4),
        'epoch': numpy.asarray(2),
        'is_new_epoch': numpy.asarray(False),
        order_key: numpy.array([3, 1, 4, 0, 5, 2, 6, 7, 9, 8]),
        'previous_epoch_detail': numpy.asarray(2.1),
    }
    if not previous:
        del values['previous_epoch_detail']
    values.update(overrides)
    f = io.BytesIO()
    numpy.savez(f, **values)
    f.seek(0)
    return f


@pytest.mark.parametrize('order_key', ['order', '_order'])
def test_loads_chainer_snapshot(order_key):
    with SerialIterator(list(range(10)), 3, seed=5) as it:
        load_npz(chainer_snapshot(order_key), it)
        assert (it.epoch, it.current_position, it.is_new_epoch) == (2, 4, False)
        assert it.previous_epoch_detail == pytest.approx(2.1)
        assert next(it) == [5, 2, 6]
        assert next(it) == [7, 9, 8]
        assert it.is_new_epoch and it.epoch == 3


def test_loads_old_chainer_snapshot_without_previous_epoch_detail():
    with SerialIterator(list(range(10)), 3, seed=5) as it:
        load_npz(chainer_snapshot(previous=False), it)
        # Chainer's guess: epoch + (position - batch_size) / epoch_size
        assert it.previous_epoch_detail == pytest.approx(2.1)


def test_loads_chainer_snapshot_of_unshuffled_iterator():
    f = io.BytesIO()
    numpy.savez(f, current_position=numpy.asarray(6), epoch=numpy.asarray(1),
                is_new_epoch=numpy.asarray(False),
                previous_epoch_detail=numpy.asarray(1.3))
    f.seek(0)
    with SerialIterator(list(range(10)), 3, shuffle=False) as it:
        load_npz(f, it)
        assert next(it) == [6, 7, 8]


def test_other_dataset_length_names_both_lengths():
    with SerialIterator(list(range(10)), 3) as it:
        state = it.state_dict()
    with SerialIterator(list(range(12)), 3) as other:
        with pytest.raises(chainiter.SnapshotMismatchError,
                           match='length 10.*length 12'):
            other.load_state_dict(state)


def test_chainer_snapshot_for_other_length_names_both_lengths():
    with SerialIterator(list(range(11)), 3) as it:
        with pytest.raises(chainiter.SnapshotMismatchError,
                           match='length 10.*length 11'):
            load_npz(chainer_snapshot(), it)


def test_shuffled_snapshot_into_unshuffled_iterator():
    with SerialIterator(list(range(10)), 3, shuffle=False) as it:
        with pytest.raises(chainiter.SnapshotMismatchError,
                           match='does not shuffle'):
            load_npz(chainer_snapshot(), it)


@pytest.mark.parametrize('content', [
    b'', b'not an npz file at all', b'PK\x03\x04 truncated zip'],
    ids=['empty', 'text', 'truncated'])
def test_not_a_snapshot_file(tmp_path, content):
    path = tmp_path / 'bad.npz'
    path.write_bytes(content)
    with SerialIterator(list(range(10)), 3) as it:
        with pytest.raises(chainiter.SnapshotMismatchError, match='npz'):
            load_npz(str(path), it)


def test_truncated_real_snapshot(tmp_path):
    path = tmp_path / 'snap.npz'
    with SerialIterator(list(range(1000)), 3) as it:
        save_npz(str(path), it)
        data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with SerialIterator(list(range(1000)), 3) as it:
        with pytest.raises(chainiter.SnapshotMismatchError):
            load_npz(str(path), it)


def test_snapshot_without_iterator_keys_suggests_path():
    f = io.BytesIO()
    numpy.savez(f, **{'updater/iterator:main/epoch': numpy.asarray(1)})
    f.seek(0)
    with SerialIterator(list(range(10)), 3) as it:
        with pytest.raises(chainiter.SnapshotMismatchError, match='path='):
            load_npz(f, it)


def test_newer_format_version_is_refused():
    with SerialIterator(list(range(10)), 3) as it:
        state = it.state_dict()
        state['format_version'] = 99
        with pytest.raises(chainiter.SnapshotMismatchError, match='upgrade'):
            it.load_state_dict(state)


def test_load_drops_prefetched_work():
    with MultithreadIterator(list(range(10)), 2, shuffle=False) as it:
        next(it)
        state = it.state_dict()
        next(it)
        next(it)
        it.load_state_dict(state)
        assert next(it) == [2, 3]


@pytest.mark.parametrize('name', ['chainer7_serial_iterator.npz',
                                  'chainer7_multiprocess_iterator.npz'])
@pytest.mark.parametrize('kind', KINDS, ids=KIND_IDS)
def test_loads_files_written_by_chainer7(name, kind):
    """Files written by chainer.serializers.save_npz (Chainer 7.8.1) from a
    shuffling iterator over range(10), batch 3, stopped at epoch 1,
    position 5 of the order [3, 5, 1, 2, 9, 8, 0, 6, 7, 4]."""
    path = str(pathlib.Path(__file__).parent / "data" / name)
    with kind(list(range(10)), 3) as it:
        load_npz(path, it)
        assert (it.epoch, it.current_position, it.is_new_epoch) == (1, 5, False)
        assert it.previous_epoch_detail == pytest.approx(1.2)
        assert next(it) == [8, 0, 6]
        wrap = next(it)
        assert wrap[:2] == [7, 4] and it.is_new_epoch and it.epoch == 2


@pytest.mark.parametrize('kind', KINDS, ids=KIND_IDS)
def test_loads_unshuffled_file_written_by_chainer7(kind):
    """Written by chainer.serializers.save_npz (Chainer 7.8.1) from
    MultithreadIterator(range(10), 3, shuffle=False) after 5 batches: its
    order is stored as a pickled None (``_order``), which is read without
    allowing pickles."""
    path = str(pathlib.Path(__file__).parent / "data" /
               "chainer7_multithread_iterator_unshuffled.npz")
    with kind(list(range(10)), 3, shuffle=False) as it:
        load_npz(path, it)
        assert (it.epoch, it.current_position, it.is_new_epoch) == (1, 5, False)
        assert it.previous_epoch_detail == pytest.approx(1.2)
        assert next(it) == [5, 6, 7]
