"""The PyTorch-style loop (``len(it)``, ``it.one_epoch()``) of the
in-process iterators; the multiprocess one is in test_multiprocess.py."""


import numpy
import pytest

import chainiter
from chainiter import SerialIterator

from helpers import restore, snapshot

def flat(batches):
    return [i for batch in batches for i in batch]


# ---- len() -----------------------------------------------------------------

@pytest.mark.parametrize('n, batch_size, expected', [
    (10, 4, 3), (8, 4, 2), (1, 4, 1), (4, 1, 4), (0, 3, 0)])
@pytest.mark.parametrize('repeat', [True, False])
def test_len_is_batches_per_epoch(make, n, batch_size, expected, repeat):
    if n == 0 and repeat:
        return      # an empty dataset needs repeat=False
    with make(list(range(n)), batch_size, repeat=repeat) as it:
        assert len(it) == expected
        assert bool(it)     # true even when empty


def test_len_follows_an_oversampling_order(make):
    class Twice(chainiter.OrderSampler):
        def __call__(self, order, position):
            return numpy.arange(15) % 5

    with make(list(range(5)), 4, order_sampler=Twice()) as it:
        assert it.epoch_size == 15 and len(it) == 4
        assert len(it.one_epoch()) == 4


# ---- one_epoch() with repeat=True ------------------------------------------

def test_epochs_cover_every_example_once_and_follow_next(make):
    """Each view yields the batches that start in its epoch (the last one
    filled up from the next epoch, as next() gives it); together the views
    are the stream of next()."""
    n, batch_size = 10, 4
    with make(list(range(n)), batch_size, seed=3) as it, \
            SerialIterator(list(range(n)), batch_size, seed=3) as ref:
        views = []
        for epoch in range(5):
            assert it.epoch == epoch
            view = it.one_epoch()
            batches = list(view)
            assert len(batches) == len(view)
            assert it.is_new_epoch and it.epoch == epoch + 1
            views.append(batches)
        # Epoch 0 starts at 0: 3 batches; epoch 1 at 2: 2 batches; ...
        assert [len(v) for v in views] == [3, 2, 3, 2, 3]
        stream = flat(flat(views))
        assert stream == flat(next(ref) for _ in range(13))
        for e in range(5):
            assert sorted(stream[e * n:(e + 1) * n]) == list(range(n))


def test_a_batch_larger_than_an_epoch_is_one_view(make):
    with make(list(range(3)), 8, shuffle=False) as it, \
            SerialIterator(list(range(3)), 8, shuffle=False) as ref:
        for _ in range(4):
            epoch = it.epoch
            view = it.one_epoch()
            assert len(view) == 1
            assert list(view) == [next(ref)]
            assert it.epoch > epoch + 1     # it spans more than one epoch


def test_one_epoch_mid_epoch_yields_the_rest(make):
    with make(list(range(10)), 3, shuffle=False) as it:
        next(it)
        view = it.one_epoch()
        assert len(view) == 3
        assert list(view) == [[3, 4, 5], [6, 7, 8], [9, 0, 1]]
        assert list(view) == []          # a view is used once
        assert it.epoch == 1 and it.current_position == 2


def test_drop_last_changes_nothing_with_repeat(make):
    with make(list(range(10)), 4, shuffle=False) as it:
        view = it.one_epoch(drop_last=True)
        assert len(view) == 3
        assert [len(b) for b in view] == [4, 4, 4]


def test_snapshot_inside_the_loop_resumes_exactly(make):
    """A snapshot taken after any batch of a view, loaded into a fresh
    iterator, goes on with the same batches, view for view."""
    def run(it, epochs, cut=None):
        out = []
        while it.epoch < epochs:
            for batch in it.one_epoch():
                out.append((it.epoch, batch))
                if cut is not None and len(out) == cut:
                    return out, snapshot(it, 'dict')
        return out, None

    with make(list(range(7)), 3, seed=1) as it:
        full, _ = run(it, 4)
    for cut in range(1, len(full)):
        with make(list(range(7)), 3, seed=1) as it:
            head, state = run(it, 4, cut)
        with make(list(range(7)), 3, seed=99) as it:
            restore(it, state, 'dict')
            tail, _ = run(it, 4)
        assert head + tail == full, cut


# ---- one_epoch() with repeat=False -----------------------------------------

def test_repeat_false_yields_a_pass_then_a_new_one(make):
    with make(list(range(10)), 4, repeat=False, seed=0) as it:
        first = it.one_epoch()
        assert len(first) == 3
        one = list(first)
        assert [len(b) for b in one] == [4, 4, 2]
        assert sorted(flat(one)) == list(range(10))
        second = list(it.one_epoch())    # finished: reset, a new pass
        assert [len(b) for b in second] == [4, 4, 2]
        assert sorted(flat(second)) == list(range(10))
        assert flat(second) != flat(one)     # reset() draws a new order


def test_drop_last_drops_the_short_batch(make):
    with make(list(range(10)), 4, repeat=False, shuffle=False) as it:
        view = it.one_epoch(drop_last=True)
        assert len(view) == 2
        assert list(view) == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert it.epoch == 1        # the short batch was consumed
        view = it.one_epoch(drop_last=True)
        assert len(view) == 2 and len(list(view)) == 2


def test_empty_dataset_views_are_empty(make):
    with make([], 4, repeat=False) as it:
        for drop_last in (False, True):
            view = it.one_epoch(drop_last=drop_last)
            assert len(view) == 0 and list(view) == []


def test_tqdm_shows_the_total(monkeypatch):
    tqdm = pytest.importorskip('tqdm')
    # No monitor thread: it would outlive the test, and later tests fork
    # (Python 3.12+ warns when a process with threads forks).
    monkeypatch.setattr(tqdm.tqdm, 'monitor_interval', 0)
    with SerialIterator(list(range(10)), 4) as it:
        bar = tqdm.tqdm(it.one_epoch(), disable=True)
        assert bar.total == 3
        assert len(list(bar)) == 3


def test_device_prefetcher_loops_through_itself():
    """A DevicePrefetcher's view takes its batches from the prefetcher (not
    the wrapped iterator) and stops at the epoch of the batch handed out."""
    def views(it, n):
        return [[b.tolist() for b in v] for v in
                (list(it.one_epoch()) for _ in range(n))]

    with SerialIterator(list(range(10)), 4, seed=2) as ref:
        expected = [[[int(i) for i in b] for b in v] for v in
                    (list(ref.one_epoch()) for _ in range(3))]
    inner = SerialIterator(list(range(10)), 4, seed=2)
    with chainiter.DevicePrefetcher(inner, device=None, depth=2) as it:
        assert len(it) == 3 and bool(it)
        assert views(it, 3) == expected
        assert it.stats['batches'] == inner.stats['batches']
