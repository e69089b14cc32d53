"""``it.loader()`` / ``chainiter.Loader``: DataLoader's protocol over every
iterator kind (an epoch per ``iter()``, ``len()`` the epoch's batches,
snapshots delegated), without any framework; the frameworks' own tests
are in test_frameworks.py."""

import functools

import numpy
import pytest

import chainiter
from chainiter import (
    DevicePrefetcher,
    IteratorFinalizedError,
    Loader,
    MultiprocessIterator,
    MultithreadIterator,
    SerialIterator,
)

from helpers import Pids, fingerprint, shm_files, wait_processes_gone


def run(loader, epochs, stop_after=None):
    """What a framework does with a loader: ``len()`` then ``iter()`` for
    each epoch.  Returns, per batch, (epoch, len at the epoch's start,
    batch fingerprint); with ``stop_after`` also the state after that many
    batches."""
    out = []
    for epoch in range(epochs):
        length = len(loader)
        for batch in loader:
            out.append((epoch, length, fingerprint(batch)))
            if len(out) == stop_after:
                return out, loader.state_dict()
    return out, None


def resumed(loader, epochs, epoch, done):
    """A framework resuming at ``epoch`` after ``done`` batches of it (as
    Lightning does): it takes ``len()`` as the whole epoch's count and
    iterates the rest of it, then goes on with whole epochs."""
    out = []
    for e in range(epoch, epochs):
        length = len(loader)
        batches = [fingerprint(b) for b in loader]
        if e == epoch:
            assert len(batches) == length - done
        out += [(e, length, b) for b in batches]
    return out


# ---- epochs and len() -----------------------------------------------------

@pytest.mark.parametrize('n, batch_size', [(10, 4), (12, 4), (3, 8), (1, 1)])
@pytest.mark.parametrize('repeat', [True, False])
def test_each_iter_is_one_epoch_and_len_counts_it(make, n, batch_size,
                                                  repeat):
    with make(list(range(n)), batch_size, repeat=repeat, seed=3) as it, \
            SerialIterator(list(range(n)), batch_size, repeat=repeat,
                           seed=3) as ref:
        loader = it.loader()
        for _ in range(5):
            length = len(loader)
            view = ref.one_epoch()
            assert length == len(view)
            assert list(loader) == list(view)


def test_repeat_true_epochs_differ_by_the_wrapped_batch(make):
    """10 examples in batches of 4: Chainer fills epoch 0's last batch with
    2 examples of epoch 1, so epoch 1 has 2 batches starting in it."""
    with make(list(range(10)), 4, seed=0) as it:
        loader = it.loader()
        lengths, examples = [], []
        for epoch in range(4):
            lengths.append(len(loader))
            batches = list(loader)
            assert len(batches) == lengths[-1]
            assert it.epoch == epoch + 1     # stopped at the epoch's end
            examples += [i for b in batches for i in b]
        assert lengths == [3, 2, 3, 2]
        for e in range(4):
            assert sorted(examples[10 * e:10 * (e + 1)]) == list(range(10))


def test_repeat_false_passes_and_drop_last(make):
    with make(list(range(10)), 4, repeat=False, seed=0) as it:
        loader = it.loader(drop_last=True)
        passes = []
        for _ in range(3):
            assert len(loader) == 2
            passes.append([list(b) for b in loader])
            assert [len(b) for b in passes[-1]] == [4, 4]
        assert passes[0] != passes[1]       # each pass a new order
        loader = it.loader()
        assert len(loader) == 3
        assert [len(b) for b in loader] == [4, 4, 2]


def test_len_follows_an_oversampling_order(make):
    class Twice(chainiter.OrderSampler):
        def __call__(self, order, position):
            return numpy.arange(10) % 5

    with make(list(range(5)), 4, order_sampler=Twice()) as it:
        loader = it.loader()
        lengths = []
        for _ in range(3):
            lengths.append(len(loader))
            assert len(list(loader)) == lengths[-1]
        assert lengths == [3, 2, 3]


def test_empty_dataset_with_repeat_false(make):
    with make([], 4, repeat=False) as it:
        loader = it.loader()
        assert len(loader) == 0 and list(loader) == [] and bool(loader)


def test_len_mid_epoch_is_the_whole_epochs_and_batches_left_the_rest(make):
    with make(list(range(10)), 4, seed=1) as it:
        loader = it.loader()
        list(loader)                        # epoch 0: 3 batches
        view = iter(loader)
        next(view)                          # epoch 1: 1 of 2 batches
        assert (len(loader), loader.batches_left) == (2, 1)
        assert len(list(iter(loader))) == 1     # the rest of epoch 1
        assert (len(loader), loader.batches_left) == (3, 3)


# ---- snapshots -------------------------------------------------------------

@pytest.mark.parametrize('repeat', [True, False])
def test_a_snapshot_after_any_batch_resumes_exactly(make, repeat):
    """A snapshot taken after each batch of a 4-epoch run through the loader
    (mid-epoch, after an epoch's last batch), loaded into a fresh loader of
    every kind, goes on with the rest of the run: the same batches in the
    same epochs, len() the same for each epoch."""
    epochs, dataset = 4, list(range(10))
    with make(dataset, 4, repeat=repeat, seed=5) as it:
        full, _ = run(it.loader(), epochs)
    # Where each batch stands in its epoch.
    done_in_epoch = [sum(1 for e, _, _ in full[:k] if e == full[k][0])
                     for k in range(len(full))]
    kinds = [SerialIterator, functools.partial(MultithreadIterator,
                                               n_threads=2)]
    for k in range(1, len(full)):
        with make(dataset, 4, repeat=repeat, seed=5) as it:
            head, state = run(it.loader(), epochs, stop_after=k)
        assert head == full[:k]
        kind = kinds[k % 2]
        with kind(dataset, 4, repeat=repeat, seed=99) as fresh:
            loader = fresh.loader()
            loader.load_state_dict(state)
            epoch, done = full[k][0], done_in_epoch[k]
            assert resumed(loader, epochs, epoch, done) == full[k:], k


def test_serialize_and_npz_go_to_the_iterator(tmp_path):
    with SerialIterator(list(range(10)), 4, seed=2) as it:
        loader = it.loader()
        view = iter(loader)
        next(view)
        chainiter.serializers.save_npz(str(tmp_path / 'l.npz'), loader)
        rest = [list(b) for b in view]
    with SerialIterator(list(range(10)), 4, seed=0) as it:
        loader = Loader(it)
        chainiter.serializers.load_npz(str(tmp_path / 'l.npz'), loader)
        assert [list(b) for b in loader] == rest


# ---- every kind ------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize('repeat', [True, False])
def test_multiprocess_loader_resumes_exactly(method, repeat):
    """MultiprocessIterator's loader under each start method: its epochs
    are SerialIterator's; snapshots taken mid-epoch and after an epoch's
    last batch resume exactly in a fresh MultiprocessIterator; nothing is
    left behind."""
    before = shm_files()
    dataset = list(range(10))
    make = functools.partial(MultiprocessIterator, dataset, 4, repeat=repeat,
                             seed=4, n_processes=2, start_method=method)
    with SerialIterator(dataset, 4, repeat=repeat, seed=4) as ref:
        full, _ = run(ref.loader(), 3)
    with make() as it:
        assert run(it.loader(), 3)[0] == full
    for k, done in [(2, 2), (3, 0)]:     # epoch 0 mid-epoch, epoch 1 start
        with make() as it:
            head, state = run(it.loader(), 3, stop_after=k)
        with make(seed=0) as it:
            loader = it.loader()
            loader.load_state_dict(state)
            assert resumed(loader, 3, full[k][0], done) == full[k:]
    assert shm_files() <= before


@pytest.mark.timeout(60)
def test_finalize_and_with_end_the_workers(method):
    before = shm_files()
    it = MultiprocessIterator(Pids(), 4, n_processes=2, start_method=method)
    with it.loader() as loader:
        pids = {e[1] for e in next(iter(loader))}
    with pytest.raises(IteratorFinalizedError):
        next(it)
    assert wait_processes_gone(pids, timeout=10)
    loader = MultiprocessIterator(Pids(), 4, n_processes=2,
                                  start_method=method).loader()
    pids = {e[1] for e in next(iter(loader))}
    loader.finalize()
    loader.finalize()
    assert wait_processes_gone(pids, timeout=10)
    assert shm_files() <= before


def test_sharded_loaders_have_the_same_len_on_every_rank():
    """Two ranks of 10 examples, batches of 2 (global 4): every rank's
    epochs have the same number of steps, and together they hand out every
    example once per epoch (repeat=True)."""
    ranks = [SerialIterator(list(range(10)), 2, seed=6, shard=(r, 2))
             for r in range(2)]
    loaders = [it.loader() for it in ranks]
    examples = []
    for _ in range(4):
        lengths = {len(loader) for loader in loaders}
        assert len(lengths) == 1
        epochs = [list(loader) for loader in loaders]
        assert {len(e) for e in epochs} == lengths
        examples += [i for step in zip(*epochs) for b in step for i in b]
    for e in range(4):
        assert sorted(examples[10 * e:10 * (e + 1)]) == list(range(10))


def test_device_prefetcher_loader():
    with DevicePrefetcher(SerialIterator(
            [numpy.full(2, i) for i in range(10)], 4, repeat=False,
            shuffle=False), '@numpy') as it:
        loader = it.loader()
        assert len(loader) == 3
        assert [b.tolist() for b in loader][2] == [[8, 8], [9, 9]]
        assert len(loader) == 3 and len(list(loader)) == 3


def test_loader_takes_a_loader_and_refuses_other_things():
    it = SerialIterator(list(range(4)), 2)
    assert Loader(it.loader()).iterator is it
    with pytest.raises(TypeError, match='chainiter iterator'):
        Loader(list(range(4)))
    assert 'SerialIterator' in repr(it.loader())
