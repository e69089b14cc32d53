"""Small batches loaded in groups: a worker loads several consecutive
batches as one task and ``next()`` hands out their rows batch by batch.
Nothing the user sees changes: the batches, the resume, the errors, the
arrays a user holds."""

import functools
import os
import threading
import time
import warnings

import numpy
import pytest

import chainiter
from chainiter import (
    MultiprocessIterator, MultithreadIterator, SerialIterator,
    concat_examples)
from chainiter.datasets import DictDataset, TupleDataset

import helpers
from helpers import assert_resume_equivalent, fingerprint, shm_files


@pytest.fixture(autouse=True)
def group_early(monkeypatch):
    """Group after two batches, whatever the batches cost, in groups of at
    most four (so that a short run crosses many groups)."""
    for kind in (MultiprocessIterator, MultithreadIterator):
        monkeypatch.setattr(kind, 'GROUP_AFTER', 2)
        monkeypatch.setattr(kind, 'GROUP_S', 10.0)
        monkeypatch.setattr(kind, 'MAX_GROUP', 4)


class Rows:
    """Example i is (float32 row, int label); per example, no batch
    method."""

    def __init__(self, n):
        self.x = numpy.arange(n * 3, dtype=numpy.float32).reshape(n, 3)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i % 7


class Ragged:
    """Example i is (an int32 array of 1 + i % 7 values, or of shape
    (1 + i % 3, 1 + i % 4), to pad; i)."""

    def __init__(self, n, ndim=1):
        self.n = n
        self.ndim = ndim

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        shape = (1 + i % 7,) if self.ndim == 1 else (1 + i % 3, 1 + i % 4)
        return numpy.full(shape, i, dtype=numpy.int32), i


_X = numpy.random.default_rng(0).random((203, 4), dtype=numpy.float32)


def _dataset(kind):
    if kind == 'per-example':
        return Rows(203)
    if kind == 'tuple':
        return TupleDataset(_X, numpy.arange(203) % 5)
    if kind == 'dict':
        return DictDataset(x=_X, y=numpy.arange(203))
    return _X          # one array: examples are its rows


def _mp(dataset, method, **kwargs):
    kwargs.setdefault('n_processes', 2)
    kwargs.setdefault('converter', concat_examples)
    return MultiprocessIterator(dataset, 5, start_method=method, **kwargs)


def _expected(dataset, n, padding=None, **kwargs):
    with SerialIterator(dataset, 5, **kwargs) as ref:
        return [fingerprint(concat_examples(next(ref), padding=padding))
                for _ in range(n)]


@pytest.mark.parametrize('kind', ['per-example', 'tuple', 'dict', 'array'])
def test_grouped_batches_are_the_serial_ones(method, kind):
    dataset = _dataset(kind)
    # 203 examples in batches of 5: the epochs end inside batches.
    expected = _expected(dataset, 130, shuffle=True, seed=3)
    with _mp(dataset, method, shuffle=True, seed=3) as it:
        got = [fingerprint(next(it)) for _ in range(130)]
        assert it.stats['batches_per_task'] == 4
    assert got == expected


def test_without_repeat_the_last_group_and_batch_are_short(method):
    dataset = _dataset('tuple')
    with SerialIterator(dataset, 5, repeat=False, shuffle=False) as ref:
        expected = [fingerprint(concat_examples(b)) for b in ref]
    assert len(expected) == 41
    with _mp(dataset, method, repeat=False, shuffle=False) as it:
        got = [fingerprint(b) for b in it]
        assert it.stats['batches_per_task'] == 4
        with pytest.raises(StopIteration):
            next(it)
        it.reset()
        again = [fingerprint(b) for b in it]
    assert got == expected
    assert again == expected


# Under spawn -m slow: chainiter's workers take forkserver's path there
# (only their start differs), and each snapshot restored starts them anew.
@pytest.mark.parametrize('method', helpers.start_methods_kept('fork',
                                                              'forkserver'))
def test_grouped_batches_resume_exactly(method):
    dataset = _dataset('per-example')

    def mp():
        return _mp(dataset, method, shuffle=True, seed=5)
    # Snapshots taken before every step: many fall inside a group.
    assert_resume_equivalent(mp, [mp], 14)
    with mp() as it:
        for _ in range(50):
            next(it)
        assert it.stats['batches_per_task'] == 4
        state = it.state_dict()
        rest = [fingerprint(next(it)) for _ in range(13)]
    with mp() as resumed:
        resumed.load_state_dict(state)
        assert [fingerprint(next(resumed)) for _ in range(13)] == rest


@pytest.mark.parametrize('batched', [False, True])
def test_an_error_in_a_group_comes_from_the_batch_that_holds_it(
        method, batched):
    # Example 301 is in batch 60, well after the groups began.
    dataset = Broken(400, 301) if batched else helpers.Failing(400, 301)
    expected = _expected(helpers.Failing(400, -1), 60, shuffle=False)
    with _mp(dataset, method, shuffle=False) as it:
        got = []
        for _ in range(60):
            got.append(fingerprint(next(it)))
            if len(got) == 40:
                assert it.stats['batches_per_task'] == 4
        assert got == expected
        for _ in range(2):      # it stays at that batch
            with pytest.raises(KeyError, match='301'):
                next(it)
            assert it.current_position == 300
        # From then on each batch goes alone.
        assert it.stats['batches_per_task'] == 1


class Broken(helpers.Failing):
    """``Failing`` with a batch method: its whole chunk fails."""

    def get_examples(self, indices):
        return [self[i] for i in indices]


def test_batches_that_change_shape_keep_the_groups(method):
    # Every batch of 5 has its own length and dtype (bucketed data): a
    # group of them does not stack as one array, so its batches go as
    # parts, each read from the workers' rows as its own.  (The first
    # mixed group ended the groups: each batch then went alone, and the
    # bucketed benchmark ran slower than the serial loop.)
    dataset = helpers.Bucketed(5 * 80, 5, lengths=(3, 9, 6),
                               dtypes=(numpy.float32, numpy.float64))
    # 160 batches: a group chosen late (after GROUP_AFTER batches the
    # workers stacked, which depends on timing) has arrived by then.
    with SerialIterator(dataset, 5, shuffle=False) as ref:
        expected = [fingerprint(concat_examples(next(ref)))
                    for _ in range(160)]
    got, by_copy = [], []
    with _mp(dataset, method, shuffle=False) as it, \
            warnings.catch_warnings():
        warnings.simplefilter('ignore', chainiter.SharedMemoryWarning)
        for _ in range(160):
            got.append(fingerprint(next(it)))
            by_copy.append(it.stats['by_copy'])
        assert it.stats['batches_per_task'] > 1
    assert got == expected
    # Once the groups go in parts, every batch is the workers' rows.
    assert by_copy[-60] == by_copy[-1]


class LateLonger(helpers.Bucketed):
    """Bucketed batches of lengths 9, 3 and 6 (the first batch is of the
    longest), but for the batches in ``longer``, of length 40."""

    def __init__(self, n, batch_size, longer):
        super().__init__(n, batch_size, lengths=(9, 3, 6))
        self.longer = longer

    def __getitem__(self, i):
        x, i = super().__getitem__(i)
        if i // self.batch_size in self.longer:
            x = numpy.full((40, self.width), i, dtype=numpy.float32)
        return x, i


@pytest.mark.parametrize('converter', [None, concat_examples])
def test_groups_go_on_after_a_longer_bucket_that_comes_late(method,
                                                            converter):
    # Batch 120 is longer than any before: its group comes by copy with
    # one warning and the buffers grow to hold it; the groups go on, and
    # batch 160, as long, is written by the workers.  (The groups ended:
    # every batch went alone from then on, and batch 160 came by copy.)
    dataset = LateLonger(5 * 240, 5, longer=(120, 160))
    convert = converter or (lambda batch: batch)
    with SerialIterator(dataset, 5, shuffle=False) as ref:
        expected = [fingerprint(convert(next(ref))) for _ in range(240)]
    got, by_copy, grouped = [], [], []
    with MultiprocessIterator(dataset, 5, n_processes=2, shuffle=False,
                              converter=converter,
                              start_method=method) as it, \
            warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        for _ in range(240):
            got.append(fingerprint(next(it)))
            by_copy.append(it.stats['by_copy'])
            grouped.append(it.stats['batches_per_task'])
    assert got == expected
    assert [w.category for w in record] == [chainiter.SharedMemoryWarning]
    assert 'shared_mem' in str(record[0].message)
    # The groups had begun before the group that holds batch 120 (of four
    # batches at most: it begins at batch 117 or later), and go on.
    assert grouped[116] > 1 and min(grouped[117:]) > 1
    # By copy: the first batch, which sizes the buffers, and that group;
    # not batch 160.
    assert by_copy[116] == 1
    assert by_copy[123] - by_copy[116] <= 4
    assert by_copy[-1] == by_copy[123]


@pytest.mark.parametrize('ndim', [1, 2])
def test_padded_batches_in_a_group_are_each_padded_to_their_own(method, ndim):
    # concat_examples pads a batch to its own longest example: every batch
    # of a group has its own shape.
    dataset = Ragged(120, ndim)
    converter = functools.partial(concat_examples, padding=-1)
    expected = _expected(dataset, 60, padding=-1, shuffle=True, seed=1)
    with MultiprocessIterator(dataset, 5, n_processes=2, shuffle=True,
                              seed=1, converter=converter,
                              start_method=method) as it, \
            warnings.catch_warnings():
        # Longer examples than the first batch's grow the buffers.
        warnings.simplefilter('ignore', chainiter.SharedMemoryWarning)
        got = [fingerprint(next(it)) for _ in range(60)]
        assert it.stats['batches_per_task'] == 4
    assert got == expected


def test_held_batches_keep_their_values_and_nothing_is_left(method):
    dataset = _dataset('tuple')
    expected = _expected(dataset, 120, shuffle=True, seed=9)
    before = shm_files()
    with _mp(dataset, method, shuffle=True, seed=9) as it:
        held = [next(it) for _ in range(120)]     # every slot stays leased
        assert it.stats['batches_per_task'] == 4
        assert [fingerprint(b) for b in held] == expected
        del held
        more = [fingerprint(next(it)) for _ in range(10)]
    assert more == _expected(dataset, 130, shuffle=True, seed=9)[120:]
    assert shm_files() <= before


class LabelsChange:
    """Example i is (float32 row, label i): the label a numpy scalar of
    ``before`` up to example ``at``, of ``after`` from there (a dataset
    whose labels change dtype between batches)."""

    def __init__(self, n, at, before, after, wide=()):
        self.n, self.at, self.before, self.after = n, at, before, after
        self.wide = wide          # batches whose rows are twice as wide

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        width = 6 if i // 5 in self.wide else 3
        label = (self.before if i < self.at else self.after)(i)
        return numpy.full(width, i, dtype=numpy.float32), label


@pytest.mark.parametrize('before, after', [
    (numpy.int64, numpy.int32), (numpy.float64, numpy.float32)])
def test_batches_whose_labels_narrow_keep_their_dtype(method, before, after):
    # A group stacks its batches as one: a worker writing int64 and int32
    # labels into one array would give int64 to the int32 batches too
    # (concat_examples of each batch alone gives its own dtype).
    for at in (497, 502, 507, 512):       # the change falls inside a group
        dataset = LabelsChange(1000, at - at % 5, before, after)
        expected = _expected_of(dataset, 130)   # fingerprints: dtypes too
        with _mp(dataset, method, shuffle=False) as it, \
                warnings.catch_warnings():
            warnings.simplefilter('ignore', chainiter.SharedMemoryWarning)
            got = [fingerprint(next(it)) for _ in range(130)]
        assert got == expected, at


def test_groups_that_stop_while_one_is_being_filled_lose_no_batch(method):
    # A batch loaded alone grows the buffers after the groups began, and
    # the depth falls: while the batches in flight drain, the last group
    # is still being filled when a later group stops the groups (its
    # labels widen). That group must still go before the batches that
    # then go one by one, or next() waits for them forever.
    for wide in (25, 26, 27, 28):     # one of them leaves a group open
        dataset = LabelsChange(1000, 5 * 50, numpy.int32, numpy.int64,
                               wide=(wide,))
        expected = _expected_of(dataset, 130)
        with _mp(dataset, method, shuffle=False, prefetch_bytes=6144,
                 dataset_timeout=10) as it, warnings.catch_warnings():
            warnings.simplefilter('ignore', chainiter.SharedMemoryWarning)
            warnings.simplefilter('error', chainiter.TimeoutWarning)
            got = [fingerprint(next(it)) for _ in range(130)]
        assert got == expected, wide


def test_groups_that_stop_leave_the_depth_of_batches_one_by_one(
        method, tmp_path):
    # Once the groups stop (a group failed: example 1501 raises, the first
    # time only), each batch goes alone again, with as many batches in
    # flight as before the groups began, not as many as there were groups
    # in flight, and in slots of one batch, not of a group.  (Example 301,
    # in batch 60, was sent alone before the groups began in 8 of 25 runs
    # of this test alone, and raised.)
    dataset = helpers.Faulty(4000, 1501, 'raise',
                             once_file=str(tmp_path / 'once'))
    with _mp(dataset, method, shuffle=False) as it:
        next(it)
        alone = it.stats['prefetch'], it._pool.slots.batch_size
        grouped = []
        for _ in range(400):
            next(it)
            stats = it.stats
            grouped.append(stats['batches_per_task'])
            # The pool counts groups in flight, the iterator batches.
            assert it._pool.book.n_jobs_ahead * grouped[-1] == \
                stats['prefetch']
        assert max(grouped) == 4 and grouped[-1] == 1
        assert (it.stats['prefetch'], it._pool.slots.batch_size) == alone


class _LockWatch:
    """The pool's lock, noting each time the main thread waits for it
    inside an ``uninterrupted()`` block, where a Ctrl-C cannot end the
    wait (``Pool.submit`` takes the lock first)."""

    def __init__(self, lock):
        self.lock = lock
        self.inside = []

    def acquire(self, *args, **kwargs):
        import threading
        import traceback
        from chainiter._interrupts import uninterrupted
        if threading.current_thread() is threading.main_thread() and \
                uninterrupted.saved is not None:
            self.inside.append(''.join(traceback.format_stack()))
        return self.lock.acquire(*args, **kwargs)

    def release(self):
        self.lock.release()

    def locked(self):
        return self.lock.locked()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def test_groups_begin_without_waiting_for_the_lock_uninterrupted(method):
    with _mp(_X, method) as it:
        next(it)
        watch = it._pool.lock = _LockWatch(it._pool.lock)
        grouped = []
        for _ in range(30):
            next(it)
            grouped.append(it.stats['batches_per_task'])
        it._pool.lock = watch.lock
        assert max(grouped) == 4
        assert not watch.inside, watch.inside[0]


def _expected_of(dataset, n):
    return [fingerprint(concat_examples([dataset[i] for i in range(
        k * 5, k * 5 + 5)])) for k in range(n)]


def test_groups_that_find_no_free_slot_do_not_end_the_groups(method):
    # Held batches hold their groups' slots: the groups that find none
    # come through the socket, their batches as they are, and the groups
    # go on once the batches are let go (only batches that differ in
    # shape or dtype, or fail, end them).
    dataset = _dataset('tuple')
    expected = _expected(dataset, 260, shuffle=True, seed=9)
    with _mp(dataset, method, shuffle=True, seed=9) as it:
        held = [next(it) for _ in range(200)]     # more than the slots
        assert [fingerprint(b) for b in held] == expected[:200]
        assert it.stats['by_copy'] > 1
        del held
        more = [fingerprint(next(it)) for _ in range(60)]
        assert it.stats['batches_per_task'] == 4
    assert more == expected[200:]


class SlowStart:
    """Rows whose first 60 loads in each worker take 1.6 ms each (a worker
    warming up), the rest next to nothing."""

    def __init__(self, n):
        self.rows = Rows(n)
        self.loads = 0

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        self.loads += 1
        if self.loads <= 60:
            time.sleep(0.0016)      # the cost of loading, not a wait
        return self.rows[i]


def test_groups_grow_once_the_loading_gets_cheaper(method, monkeypatch):
    # The first measure sees batches of about 8 ms: groups of 2 or 3 in
    # 30 ms.  Measured again after 40 batches, over 40 more, they cost
    # next to nothing: groups of MAX_GROUP.
    monkeypatch.setattr(MultiprocessIterator, 'GROUP_S', 0.03)
    monkeypatch.setattr(MultiprocessIterator, 'MAX_GROUP', 8)
    monkeypatch.setattr(MultiprocessIterator, 'REGROUP_AFTER', 40)
    expected = _expected(Rows(203), 150, shuffle=True, seed=3)
    with _mp(SlowStart(203), method, shuffle=True, seed=3) as it:
        got, sizes = [], []
        for _ in range(150):
            got.append(fingerprint(next(it)))
            sizes.append(it.stats['batches_per_task'])
    assert got == expected
    assert 1 < sizes[10] < 8 and sizes[-1] == 8, sizes


def _wait_ready(it, count, timeout=30):
    """Until ``count`` batches wait loaded (each group's arrive whole)."""
    deadline = time.monotonic() + timeout
    while it.stats['ready'] < count:
        assert time.monotonic() < deadline, it.stats
        time.sleep(0.001)


def test_ready_counts_the_batches_that_wait_when_groups_begin(
        method, monkeypatch):
    # When groups begin, batches loaded one by one still wait: each counts
    # as one batch in stats['ready'], not as a group, and no more wait
    # than were sent to the workers.
    monkeypatch.setattr(MultiprocessIterator, 'GROUP_AFTER', 12)
    monkeypatch.setattr(MultiprocessIterator, 'MAX_GROUP', 8)
    with _mp(_dataset('tuple'), method) as it:
        for _ in range(11):
            next(it)
        assert it.stats['batches_per_task'] == 1
        _wait_ready(it, it.stats['prefetch'])     # singles, all loaded
        most = it.stats['prefetch']
        for _ in range(40):
            next(it)
            stats = it.stats
            most = max(most, stats['prefetch'])
            assert stats['ready'] <= most + stats['batches_per_task'], stats
        assert stats['batches_per_task'] == 8


def test_a_rewind_anywhere_in_a_group_loses_no_batch(method):
    # While a group is handed out, next() takes in the next group (its
    # batch taken from the pool, then read) a step at a call. A state
    # loaded into the running iterator at any of those steps drops the
    # groups ahead, whatever step they are at: the batches that follow
    # are the serial ones, and the arrays held keep their values.
    dataset = _dataset('tuple')
    expected = _expected(dataset, 200, shuffle=True, seed=7)
    before = shm_files()
    with _mp(dataset, method, shuffle=True, seed=7) as it:
        for _ in range(50):
            next(it)
        assert it.stats['batches_per_task'] == 4
        held = []
        position = 50
        for taken in range(1, 25):
            state = it.state_dict()
            # Two groups loaded: the first one's calls take in the second.
            _wait_ready(it, 8)
            batches = [next(it) for _ in range(taken % 8 + 1)]
            got = [fingerprint(b) for b in batches]
            assert got == expected[position:position + len(got)], taken
            held.append((batches, got))
            it.load_state_dict(state)
            assert fingerprint(next(it)) == expected[position]
            position += 1
        for batches, got in held:
            assert [fingerprint(b) for b in batches] == got
        del held, batches
    assert shm_files() <= before


@pytest.mark.parametrize('held', ['rows', 'example', 'array'])
def test_a_view_of_a_grouped_batch_a_forked_child_holds_is_kept(method,
                                                                held):
    # The iterator holds the group's arrays too: a view of one of its
    # batches that the user holds at a fork (the batch itself dropped)
    # keeps the slot for the child, which reads it after the parent has
    # iterated on.  List batches (no converter): the iterator holds the
    # group's examples, the very objects of the batches it hands out; the
    # user holds one example, or the array of one.
    dataset = _dataset('tuple')
    converter = concat_examples if held == 'rows' else None
    with _mp(dataset, method, shuffle=False, converter=converter) as it:
        for _ in range(50):
            next(it)
        assert it.stats['batches_per_task'] == 4
        while it.stats['ready'] < 12:     # mid-group, the next loaded
            next(it)
        batch = next(it)
        view = batch[0][1:] if held == 'rows' else batch[1] \
            if held == 'example' else batch[1][0]
        del batch
        verdict = helpers.fork_reader(view)
        del view
        for _ in range(60):        # slots are reused many times over
            next(it)
        assert verdict()


@pytest.mark.parametrize('converter', [concat_examples, None])
@pytest.mark.parametrize('data', ['uniform', 'bucketed'])
def test_forks_keep_only_the_slots_of_batches_handed_out(method, data,
                                                         converter):
    # A fork retires the slots that arrays handed out view (the child may
    # read them): the batches loaded ahead and read by the receiver
    # thread were not handed out, and the group that the iterator hands
    # out batches from is viewed by the iterator's own arrays, which the
    # child drops.  A fork for each evaluation (Chainer's Evaluator copies
    # the iterator; a fork iterator forks its launcher) while the user
    # holds no batch must keep no slot, and no descriptor: their counts
    # must not grow with the number of forks.  Bucketed: groups whose
    # batches are read apart (each batch its own arrays).  List batches
    # (no converter): the iterator keeps the group's examples, each made
    # of views of its rows, and hands out lists of them (a fork retired
    # the group's slot: 1 slot and 2 descriptors more a fork).
    if data == 'uniform':
        dataset = _dataset('tuple')
        order = dict(shuffle=True, seed=2)
    else:
        # The longest first: no batch outgrows the buffers, so none
        # comes by copy, and the second tells that shapes change.
        dataset = helpers.Bucketed(5 * 160, 5, lengths=(9, 3, 6))
        order = dict(shuffle=False)
    if converter is None:
        with SerialIterator(dataset, 5, **order) as ref:
            expected = [fingerprint(next(ref)) for _ in range(120)]
    else:
        expected = _expected(dataset, 120, **order)
    with _mp(dataset, method, converter=converter, **order) as it:
        got = [fingerprint(next(it)) for _ in range(50)]
        assert it.stats['batches_per_task'] == 4
        counts = []
        for _ in range(10):
            # 7 batches: the forks fall at each place in a group.
            got += [fingerprint(next(it)) for _ in range(7)]
            _wait_ready(it, 16)
            with warnings.catch_warnings():
                # The child only exits.
                warnings.simplefilter('ignore', DeprecationWarning)
                pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            counts.append((len(os.listdir('/proc/self/fd')),) +
                          helpers.mapped_buffers())
        assert it.stats['by_copy'] == 1      # the first batch only
    assert got == expected
    # (descriptors, slots mapped, slots' descriptors) after each fork:
    # a slot or two more as the pipeline may use, not one a fork (which
    # was 14 descriptors more after the 10th fork than after the first).
    assert all(b - a <= 4 for a, b in zip(counts[0], counts[-1])), counts


def test_a_worker_death_in_groups_is_told(method, tmp_path):
    # Groups taken ahead by the receiver thread never pass through the
    # pool's wait: the warning of a death among them must reach the user
    # all the same, and nothing is lost.
    dataset = helpers.Faulty(400, bad=301, fault='exit',
                             once_file=str(tmp_path / 'happened'))
    with pytest.warns(chainiter.WorkerRestartWarning, match='exit code 7'):
        with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                                  converter=concat_examples,
                                  start_method=method) as it:
            got = [fingerprint(next(it)) for _ in range(150)]
    expected = [fingerprint(concat_examples([dataset[i] for i in
                                             range(k * 4, k * 4 + 4)]))
                for k in range(100)]
    expected += expected[:50]
    assert got == expected


ARGUMENTS = {
    'n_prefetch': {'n_prefetch': 8},
    'shared_mem': {'shared_mem': 64},
    'maxtasksperchild': {'maxtasksperchild': 4},
    'all': {'n_prefetch': 8, 'shared_mem': 64, 'maxtasksperchild': 4},
}


@pytest.mark.parametrize('arguments, padded', [
    ('n_prefetch', False), ('shared_mem', True), ('maxtasksperchild', False),
    ('all', True)])
def test_every_argument_keeps_the_groups_and_the_serial_batches(
        method, arguments, padded):
    # n_prefetch is a floor of batches in flight (a group as its
    # batches), shared_mem sizes the rows, maxtasksperchild counts a group
    # as its batches: none of them turns the groups off, and the batches
    # stay the serial ones.
    kwargs = ARGUMENTS[arguments]
    dataset = Ragged(203) if padded else _dataset('per-example')
    padding = 0 if padded else None
    expected = _expected(dataset, 40, padding, shuffle=True, seed=3)
    converter = functools.partial(concat_examples, padding=0) if padded \
        else concat_examples
    with MultiprocessIterator(dataset, 5, n_processes=2, shuffle=True,
                              seed=3, converter=converter,
                              start_method=method, **kwargs) as it, \
            warnings.catch_warnings():
        if padded and 'shared_mem' not in kwargs:
            # The first batch sizes the buffers; longer examples come.
            warnings.simplefilter('ignore', chainiter.SharedMemoryWarning)
        got, groups = [], []
        for _ in range(40):
            got.append(fingerprint(next(it)))
            groups.append(it.stats['batches_per_task'])
            if 'n_prefetch' in kwargs:
                assert it.stats['prefetch'] >= kwargs['n_prefetch']
    assert got == expected
    assert max(groups) > 1


class Pids:
    """Example i is (i, the pid of the process that loaded it)."""

    def __len__(self):
        return 400

    def __getitem__(self, i):
        return numpy.int64(i), numpy.int64(os.getpid())


def test_with_maxtasksperchild_a_group_counts_as_its_batches(method):
    # Each worker is replaced after 4 tasks, a group of 4 batches counting
    # as 4: no worker loads more than 4 + 3 batches (its last task a
    # group), where 4 groups of 4 would be 16.
    with MultiprocessIterator(Pids(), 5, n_processes=2, shuffle=False,
                              maxtasksperchild=4, converter=concat_examples,
                              start_method=method) as it:
        pids, groups = [], []
        for _ in range(42):
            index, pid = next(it)
            pids += pid.tolist()
            groups.append(it.stats['batches_per_task'])
    assert max(groups) == 4
    per_worker = {pid: pids.count(pid) for pid in set(pids)}
    assert max(per_worker.values()) <= 7 * 5, per_worker
    assert len(per_worker) >= 42 // 7


class GrowsLate(Ragged):
    """``Ragged`` whose example 301 (in batch 60, well after the groups
    began) is 400 values long: it does not fit the padded rows."""

    def __getitem__(self, i):
        if i == 301:
            return numpy.full(400, i, dtype=numpy.int32), i
        return super().__getitem__(i)


@pytest.mark.parametrize('shared_mem', [None, 64])
def test_a_padded_group_with_an_example_too_long_for_its_rows(
        method, shared_mem):
    # The group holding example 301 comes back in parts (one per batch,
    # each padded to its own longest example), one of them whole: the
    # main process reads the parts and converts that batch itself.
    dataset = GrowsLate(400)
    pad = functools.partial(concat_examples, padding=0)
    with SerialIterator(dataset, 5, shuffle=False) as ref:
        expected = [fingerprint(pad(next(ref))) for _ in range(70)]
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', chainiter.SharedMemoryWarning)
        with MultiprocessIterator(
                dataset, 5, n_processes=2, shuffle=False, converter=pad,
                shared_mem=shared_mem, start_method=method) as it:
            got = []
            for _ in range(70):
                got.append(fingerprint(next(it)))
                if len(got) == 40:
                    assert it.stats['batches_per_task'] == 4
    assert got == expected


# ---- an explicit n_prefetch is a floor --------------------------------------

@pytest.mark.parametrize('grouped', [False, True],
                         ids=['one-by-one', 'grouped'])
def test_n_prefetch_keeps_at_least_that_many_batches_ahead(
        method, grouped, monkeypatch, tmp_path):
    """After the user takes batch k, batches k + 1 ... k + N are loaded
    or loading (every example of them is loaded, without another
    ``next()``), N = n_prefetch = 40, more than the self-tuned depth (16
    per worker): one by one, and in groups of 4, whatever batch of its
    group k is (the last group may still be filling)."""
    _keeps_ahead(functools.partial(MultiprocessIterator, n_processes=2,
                                   start_method=method),
                 grouped, monkeypatch, tmp_path)


@pytest.mark.parametrize('grouped', [False, True],
                         ids=['one-by-one', 'grouped'])
def test_n_prefetch_keeps_at_least_that_many_batches_ahead_in_threads(
        grouped, monkeypatch, tmp_path):
    """The same with worker threads (the same pipeline)."""
    _keeps_ahead(functools.partial(MultithreadIterator, n_threads=2),
                 grouped, monkeypatch, tmp_path)


def _keeps_ahead(make, grouped, monkeypatch, tmp_path):
    if not grouped:
        monkeypatch.setattr(make.func, 'GROUP_AFTER', 10 ** 9)
    n_prefetch, size = 40, 4
    log = str(tmp_path / 'loads')
    dataset = helpers.LoggedLoads(size * 200, log)
    pause = threading.Event()

    def loaded_through(batch):
        # Every example of batches 0 ... batch is loaded (a deadline).
        wanted = set(range(size * (batch + 1)))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if wanted <= set(helpers.logged_loads(log).tolist()):
                return True
            pause.wait(0.005)
        return False

    with make(dataset, size, repeat=False, shuffle=False,
              n_prefetch=n_prefetch, converter=concat_examples) as it:
        # One by one, 14 batches; in groups, until the group size is
        # chosen (the first measure comes once batches arrive after the
        # first: a few dozen batches), then until the batches dispatched
        # since fill the depth, and 8 more: every batch of a group is k.
        k, last, chosen = 0, 14, None
        while k < last:
            got = next(it)
            assert got.tolist() == list(range(size * k, size * (k + 1)))
            assert loaded_through(k + n_prefetch), \
                (k, it.stats['prefetch'], it.stats['batches_per_task'])
            assert it.stats['prefetch'] >= n_prefetch
            if grouped and chosen is None:
                if it.stats['batches_per_task'] > 1:
                    chosen = k
                    last = k + 2 * it.stats['prefetch'] + 8
                else:
                    last = k + 2
            k += 1
        assert it.stats['batches_per_task'] == (4 if grouped else 1)
        assert last < 200 - n_prefetch


# The arguments of issue 46's table, on its two workloads (smaller here):
# tiny (float32[16] copy, int label) and variable (one int32 array of
# sequences of length 10..2000, a slice copied, int label; padded).
TABLE = {
    'defaults': {},
    'n_prefetch=4': {'n_prefetch': 4},
    'shared_mem=8000': {'shared_mem': 8000},
    'maxtasksperchild=1000': {'maxtasksperchild': 1000},
    'list': {'converter': None},
}


@pytest.mark.parametrize('arguments', sorted(TABLE))
@pytest.mark.parametrize('workload', ['tiny', 'variable'])
def test_the_table_arguments_give_the_serial_batches_in_groups(
        method, workload, arguments):
    from chainiter.bench import workloads
    if workload == 'tiny':
        dataset, size = workloads.TinyCopy(1500), 32
        converter = concat_examples
    else:
        dataset, size = workloads.VariablePacked(300), 16
        converter = functools.partial(concat_examples, padding=0)
    kwargs = dict(TABLE[arguments])
    listed = 'converter' in kwargs
    kwargs.setdefault('converter', converter)
    with MultiprocessIterator(dataset, size, n_processes=2, seed=3,
                              start_method=method, **kwargs) as it, \
            SerialIterator(dataset, size, seed=3) as ref, \
            warnings.catch_warnings():
        if workload == 'variable' and 'shared_mem' not in kwargs:
            # The first batch sizes the buffers; longer examples come.
            warnings.simplefilter('ignore', chainiter.SharedMemoryWarning)
        groups = []
        for step in range(60):
            got, expected = next(it), next(ref)
            if listed:
                # The list of examples, as Chainer's StandardUpdater
                # takes it, then converted in the loop.
                assert isinstance(got, list) and len(got) == len(expected)
                assert fingerprint(got) == fingerprint(expected), step
                got = converter(got)
            assert fingerprint(got) == fingerprint(converter(expected)), \
                step
            groups.append(it.stats['batches_per_task'])
            assert it.stats['prefetch'] >= kwargs.get('n_prefetch', 1)
    assert max(groups) > 1, groups      # no argument turns them off
