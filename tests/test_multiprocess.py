"""MultiprocessIterator: the same batches as SerialIterator, through worker
processes and shared memory, under every start method."""

import contextlib
import ctypes
import functools
import gc
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
import warnings

import numpy
import pytest

import chainiter
from chainiter import (
    MultiprocessIterator,
    MultithreadIterator,
    SerialIterator,
    concat_examples,
)
from chainiter._cpus import usable_cpus
import helpers
from helpers import (
    AugmentedDataset,
    Examples,
    Megabyte,
    Pids,
    assert_resume_equivalent,
    fingerprint,
    shm_files,
    wait_processes_gone,
)


def same_stream(make_mp, make_ref, steps):
    with make_mp() as it, make_ref() as ref:
        for step in range(steps):
            try:
                expected = next(ref)
            except StopIteration:
                with pytest.raises(StopIteration):
                    next(it)
                return
            got = next(it)
            assert fingerprint(got) == fingerprint(expected), step
            assert (it.epoch, it.current_position, it.is_new_epoch) == (
                ref.epoch, ref.current_position, ref.is_new_epoch)
            assert it.epoch_detail == ref.epoch_detail
            assert it.previous_epoch_detail == ref.previous_epoch_detail


# (n_processes, n_prefetch, shuffle, repeat, dataset size); batch size 4.
CONFIGS = [
    (1, 1, True, True, 12), (2, 3, True, False, 13), (3, 1, False, True, 13),
    (2, 1, False, False, 12), (3, 3, True, True, 10), (1, 3, False, False, 9),
]


@pytest.mark.parametrize('config', CONFIGS, ids=str)
def test_same_batches_as_serial(method, config):
    n_processes, n_prefetch, shuffle, repeat, n = config
    dataset = Examples(n, 'tuple')
    same_stream(
        lambda: MultiprocessIterator(
            dataset, 4, repeat=repeat, shuffle=shuffle,
            n_processes=n_processes, n_prefetch=n_prefetch, seed=5,
            start_method=method),
        lambda: SerialIterator(dataset, 4, repeat=repeat, shuffle=shuffle,
                               seed=5),
        12)


@pytest.mark.parametrize('kind', ['tuple', 'dict', 'array', 'plain',
                                  'varying', 'mixed'])
def test_example_kinds(method, kind):
    dataset = Examples(11, kind)
    with at_most_one_size_warning():
        same_stream(
            lambda: MultiprocessIterator(dataset, 3, n_processes=2, seed=1,
                                         start_method=method),
            lambda: SerialIterator(dataset, 3, seed=1), 10)


@contextlib.contextmanager
def at_most_one_size_warning():
    """Examples of varying size may outgrow the buffers measured from the
    first batch: that is warned about once."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        yield
    others = [w for w in record
              if w.category is not chainiter.SharedMemoryWarning]
    assert not others, [str(w.message) for w in others]
    assert len(record) <= 1


@pytest.mark.parametrize('padding', [None, 0, -1])
@pytest.mark.parametrize('kind', ['tuple', 'dict', 'array', 'varying'])
def test_stacked_mode_equals_concat_examples(method, kind, padding):
    if kind == 'varying' and padding is None:
        pytest.skip('ragged examples need padding')
    dataset = Examples(11, kind)
    converter = concat_examples if padding is None else functools.partial(
        concat_examples, padding=padding)
    with MultiprocessIterator(dataset, 3, n_processes=2, seed=1,
                              converter=converter,
                              start_method=method) as it, \
            SerialIterator(dataset, 3, seed=1) as ref, \
            at_most_one_size_warning():
        for _ in range(10):
            got = next(it)
            expected = converter(next(ref))
            assert_same_arrays(got, expected)


class Irregular:
    """(float32 array of 4, int label), but some examples are not what the
    first batch showed: a non-contiguous array, a float64 and an int32
    array, a float label, a bool label, a numpy scalar label, an int too
    large for int64."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        x = numpy.arange(i, i + 4, dtype=numpy.float32)
        label = i
        if i == 5:
            x = numpy.arange(i, i + 8, dtype=numpy.float32)[::2]
        elif i == 9:
            x = x.astype(numpy.float64)
        elif i == 10:
            x = x.astype(numpy.int32)     # as many bytes as float32
        elif i == 13:
            label = 2.5
        elif i == 14:
            label = True
        elif i == 18:
            label = numpy.int64(18)
        elif i == 21:
            label = 2 ** 70     # no int64 holds it
        return x, label


def test_stacked_mode_equals_concat_examples_for_irregular_examples(method):
    with MultiprocessIterator(Irregular(), 4, n_processes=2, shuffle=False,
                              converter=concat_examples,
                              start_method=method) as it, \
            SerialIterator(Irregular(), 4, shuffle=False) as ref, \
            pytest.warns(chainiter.SharedMemoryWarning,
                         match='shared_mem=') as record:
        for step in range(18):
            got = next(it)
            assert_same_arrays(got, concat_examples(next(ref)))
            if step > 0 and step % 6 in (0, 4):
                # Batches like the first one still go through shared
                # memory: the odd ones did not spoil the layout.
                assert views_shared_memory(got[0]), step
    # The float64 array outgrew the float32 rows: the buffers grew, once.
    assert len(record) == 1


class ShapeShift:
    """Arrays of shape (2, 3), but example 2 is (1, 3) and example 3 is
    (3, 3): together they have the rows of two regular examples."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        rows = {2: 1, 3: 3}.get(i, 2)
        return numpy.full((rows, 3), i, dtype=numpy.float32)


def test_stacked_mode_rejects_shapes_that_only_add_up(method):
    with MultiprocessIterator(ShapeShift(), 2, shuffle=False, n_processes=1,
                              converter=concat_examples,
                              start_method=method) as it:
        assert next(it).shape == (2, 2, 3)
        with pytest.raises(ValueError):
            concat_examples([ShapeShift()[2], ShapeShift()[3]])
        with pytest.raises(ValueError):
            next(it)   # as concat_examples: never a silently reshaped batch
        assert it.current_position == 2


# Bucketed data: the shape (or the dtype) of one field changes from batch
# to batch, each batch uniform; the largest example has these bytes.
CHANGES = {
    'lengths': (dict(lengths=(16, 64, 32, 128)), 128 * 64 * 4 + 8),
    'dtypes': (dict(lengths=(16,), dtypes=(numpy.float32, numpy.float64,
                                           numpy.int16)), 16 * 64 * 8 + 8),
}


@pytest.mark.parametrize('change', sorted(CHANGES))
def test_batches_of_changing_shapes_are_written_by_the_workers(method,
                                                               change):
    options, largest = CHANGES[change]
    dataset = helpers.Bucketed(4 * 40, 4, width=64, **options)
    before = helpers.shm_mapped_bytes()
    # A budget that holds no more than the fewest batches in flight (2
    # per worker, or per CPU): a shallow depth, and no groups.
    with MultiprocessIterator(dataset, 4, n_processes=2, prefetch_bytes=1,
                              shuffle=False, converter=concat_examples,
                              start_method=method) as it, \
            SerialIterator(dataset, 4, shuffle=False) as ref, \
            pytest.warns(chainiter.SharedMemoryWarning,
                         match='shared_mem=') as record:
        for step in range(40):
            got = next(it)
            assert_same_arrays(got, concat_examples(next(ref)))
            if step == 0:
                depth = it.stats['prefetch']
                assert depth <= 4
            elif step == 9 + depth:
                copies = it.stats['by_copy']
            elif step > 9 + depth:
                # Every shape seen: the workers write every batch.
                assert all(views_shared_memory(a) for a in got), step
        # The first batch, and those that found the buffers too small
        # (the buffers grow twice at most, with depth batches in flight).
        assert it.stats['by_copy'] == copies <= 1 + 2 * (depth + 2)
        assert it.stats['prefetch'] == depth
        mapped = helpers.shm_mapped_bytes() - before
    assert len(record) == 1, [str(w.message) for w in record]
    # The buffers of the smaller layouts are gone: depth + 2 slots of at
    # most GROWTH times the largest batch (and a page each).
    assert mapped <= (depth + 2) * (4 * largest * 1.25 + 8192), mapped


def test_bucketed_batches_resume_exactly_and_shared_mem_avoids_copies(
        method):
    dataset = helpers.Bucketed(4 * 10, 4, width=64)
    room = 128 * 64 * 4 + 8

    def mp(n_processes):
        return lambda: MultiprocessIterator(
            dataset, 4, n_processes=n_processes, n_prefetch=2,
            shuffle=False, shared_mem=room, converter=concat_examples,
            start_method=method)
    assert_resume_equivalent(mp(2), [mp(1)], 6)
    with mp(2)() as it:
        for step in range(12):
            got = next(it)
            assert step == 0 or all(views_shared_memory(a) for a in got)
        assert it.stats['by_copy'] == 1      # the first: it measures


def test_bucketed_batches_split_among_workers_equal_concat_examples(
        method, monkeypatch):
    # Fewer batches in flight than workers: each batch is cut in chunks.
    # (An explicit n_prefetch is a floor; the fewest the iterator keeps
    # in flight is 2 per CPU, when the budget holds no more: with 3
    # workers on a machine it sees as 1 CPU, 2 batches for 3 workers.)
    from chainiter.iterators.pipeline.processes import iterator
    monkeypatch.setattr(iterator, 'usable_cpus', lambda: 1)
    dataset = helpers.Bucketed(4 * 12, 4, width=64)
    with MultiprocessIterator(dataset, 4, n_processes=3, prefetch_bytes=1,
                              shuffle=False, converter=concat_examples,
                              start_method=method) as it, \
            SerialIterator(dataset, 4, shuffle=False) as ref, \
            warnings.catch_warnings():
        warnings.simplefilter('ignore', chainiter.SharedMemoryWarning)
        for _ in range(16):
            assert_same_arrays(next(it), concat_examples(next(ref)))
            assert it.stats['prefetch'] == 2


def views_shared_memory(array):
    """True when ``array`` is a view of a shared-memory slot (its chain of
    bases ends in the ctypes object that exports the slot)."""
    base = array
    while isinstance(base, numpy.ndarray):
        base = base.base
    return isinstance(base, ctypes.Array)


def assert_same_arrays(got, expected):
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected)
        for a, b in zip(got, expected):
            assert_same_arrays(a, b)
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys()
        for key in expected:
            assert_same_arrays(got[key], expected[key])
    else:
        assert got.dtype == expected.dtype and got.shape == expected.shape
        numpy.testing.assert_array_equal(got, expected)


def test_stacked_mode_hands_out_views_of_shared_memory(method):
    dataset = Examples(12, 'tuple')
    with MultiprocessIterator(dataset, 4, n_processes=2,
                              converter=concat_examples,
                              start_method=method) as it:
        next(it)                     # the first batch measures the sizes
        x, label, half = next(it)
        for array in (x, label, half):
            assert views_shared_memory(array)


def test_other_converter_is_applied_in_the_parent(method):
    def count(batch):
        return len(batch)
    with MultiprocessIterator(Examples(10, 'tuple'), 4, n_processes=1,
                              converter=count, start_method=method) as it:
        assert [next(it) for _ in range(3)] == [4, 4, 4]


def without_pid(batch):
    return {key: value for key, value in batch.items() if key != 'pid'}


def test_converter_in_workers_gives_the_parents_batches(method):
    dataset = AugmentedDataset(30)
    with MultiprocessIterator(dataset, 4, n_processes=2, n_prefetch=1,
                              seed=4, converter=helpers.collate,
                              converter_in_workers=True,
                              start_method=method) as it, \
            SerialIterator(dataset, 4, seed=4) as ref:
        for step in range(20):
            got = next(it)
            expected = helpers.collate(next(ref))
            assert fingerprint(without_pid(got)) == fingerprint(
                without_pid(expected))
            assert got['pid'] != os.getpid()     # converted in a worker
            if step > 0:         # the first batch measures the buffers
                assert views_shared_memory(got['x'])
                assert views_shared_memory(got['pair'][0])
        assert it.stats['by_copy'] == 1
        state = it.state_dict()
        rest = [fingerprint(without_pid(next(it))) for _ in range(4)]
    with MultiprocessIterator(dataset, 4, n_processes=1, seed=0,
                              converter=helpers.collate,
                              converter_in_workers=True,
                              start_method=method) as resumed:
        resumed.load_state_dict(state)
        assert [fingerprint(without_pid(next(resumed)))
                for _ in range(4)] == rest


def test_converter_in_workers_sees_whole_batches_when_shallow(method,
                                                             two_cpus):
    """Slots over prefetch_bytes and more workers than twice the CPUs: a
    converter in the workers still gets each batch whole, never a chunk
    of it, and a batch per worker at least is in flight."""
    dataset = AugmentedDataset(40)
    with MultiprocessIterator(dataset, 4, n_processes=2 * two_cpus + 1,
                              seed=4, converter=helpers.collate,
                              converter_in_workers=True, prefetch_bytes=1,
                              start_method=method) as it, \
            SerialIterator(dataset, 4, seed=4) as ref:
        for _ in range(12):
            assert fingerprint(without_pid(next(it))) == fingerprint(
                without_pid(helpers.collate(next(ref))))
        assert it.stats['prefetch'] >= it.n_processes


def test_converter_in_workers_error_comes_with_the_worker_traceback(method):
    dataset = AugmentedDataset(12)
    with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              converter=helpers.collate_failing_at(5),
                              converter_in_workers=True,
                              start_method=method) as it:
        next(it)
        with pytest.raises(ArithmeticError, match='batch of 5') as info:
            next(it)
        assert '_collate_or_fail' in str(info.value.__cause__)
        assert it.current_position == 4
        with pytest.raises(ArithmeticError):
            next(it)                 # converted again: fails again


def test_converter_in_workers_is_checked_before_workers_start(method):
    def local(batch):
        return len(batch)
    if method == 'fork':
        with MultiprocessIterator(Examples(8, 'tuple'), 4, n_processes=1,
                                  converter=local, converter_in_workers=True,
                                  start_method=method) as it:
            assert next(it) == 4     # fork: the workers inherit it
    else:
        with pytest.raises(TypeError, match='converter'):
            MultiprocessIterator(Examples(8, 'tuple'), 4,
                                 converter=helpers.UnpicklableCall(),
                                 converter_in_workers=True,
                                 start_method=method)
    with pytest.raises(ValueError, match='converter='):
        MultiprocessIterator(Examples(8, 'tuple'), 4,
                             converter_in_workers=True, start_method=method)


@pytest.mark.parametrize('converter', [None, concat_examples],
                         ids=['list', 'stacked'])
def test_held_batches_stay_intact(method, converter):
    dataset = Examples(37, 'tuple')
    with MultiprocessIterator(dataset, 5, n_processes=2, n_prefetch=2,
                              seed=3, converter=converter,
                              start_method=method) as it, \
            SerialIterator(dataset, 5, seed=3) as ref:
        held = [next(it) for _ in range(20)]
        expected = [next(ref) for _ in range(20)]
        for _ in range(5):           # keep the workers busy meanwhile
            next(it)
    for got, want in zip(held, expected):
        if converter is None:
            assert fingerprint(got) == fingerprint(want)
        else:
            assert_same_arrays(got, concat_examples(want))


# Resuming across numbers of workers and into threads is the pipeline's,
# whatever the start method; that a snapshot resumes under forkserver and
# spawn (to SerialIterator and to MultiprocessIterator) is test_resume.py's
# test_resume_equivalence_multiprocess.  Here those two are -m slow: each
# of the 27 targets starts its workers anew (seconds under spawn).
@pytest.mark.parametrize('method', helpers.start_methods_kept('fork'))
def test_resume_equivalence(method):
    dataset = AugmentedDataset(11)

    def mp(n_processes, seed):
        return lambda: MultiprocessIterator(
            dataset, 4, n_processes=n_processes, n_prefetch=2, seed=seed,
            start_method=method)
    targets = [lambda: SerialIterator(dataset, 4, seed=2),
               lambda: MultithreadIterator(dataset, 4, n_threads=2, seed=2),
               mp(1, 2), mp(3, 2)]
    assert_resume_equivalent(mp(2, 1), targets, 9)


def test_serial_snapshot_resumes_in_multiprocess(method):
    dataset = AugmentedDataset(11)
    assert_resume_equivalent(
        lambda: SerialIterator(dataset, 4, seed=1),
        [lambda: MultiprocessIterator(dataset, 4, n_processes=2, seed=3,
                                      start_method=method)], 9)


def test_reset_drops_work_in_flight(method):
    dataset = Examples(10, 'array')
    with MultiprocessIterator(dataset, 3, n_processes=2, n_prefetch=3,
                              seed=4, start_method=method) as it:
        [next(it) for _ in range(4)]
        it.reset()
        got = [fingerprint(next(it)) for _ in range(4)]
    with SerialIterator(dataset, 3, seed=4) as ref:
        [next(ref) for _ in range(4)]
        ref.reset()
        assert got == [fingerprint(next(ref)) for _ in range(4)]


def test_worker_init_fn_and_worker_info(method):
    with MultiprocessIterator(Pids(), 4, n_processes=2, shuffle=False,
                              worker_init_fn=helpers.mark_worker,
                              start_method=method) as it:
        examples = [e for _ in range(3) for e in next(it)]
    assert [e[0] for e in examples] == list(range(12))
    pids = {e[1] for e in examples}
    assert os.getpid() not in pids
    for _, _pid, info, mark in examples:
        assert info is not None and info.num_workers == 2
        assert info.id in (0, 1) and mark == info.id
        # Still the tuple it was, incarnation beside it.
        worker_id, num_workers, seed = info
        assert (worker_id, num_workers) == (info.id, 2)
        assert seed == info.seed and info.incarnation == 0
    assert chainiter.get_worker_info() is None


@pytest.mark.skipif(not hasattr(os, 'SCHED_BATCH'),
                    reason='Linux scheduling policies')
def test_workers_do_not_preempt_the_training_loop(method):
    # SCHED_BATCH: a worker woken by a task waits for the scheduler's tick
    # instead of taking the CPU from the main process; a worker_init_fn
    # may set another policy.
    policy = os.sched_getscheduler(0)
    with MultiprocessIterator(helpers.SchedulingPolicy(), 4, n_processes=2,
                              shuffle=False, start_method=method) as it:
        assert set(next(it) + next(it)) == {os.SCHED_BATCH}
    with MultiprocessIterator(helpers.SchedulingPolicy(), 4, n_processes=2,
                              shuffle=False, start_method=method,
                              worker_init_fn=helpers.normal_policy) as it:
        assert set(next(it) + next(it)) == {os.SCHED_OTHER}
    assert os.sched_getscheduler(0) == policy


def worker_rngs(method, seed, torch):
    """``{worker id: (torch's seed, a first draw of random, of numpy)}``
    of both workers (batches are read until each has loaded one: under
    load, one worker may start late)."""
    found = {}
    with MultiprocessIterator(helpers.WorkerRngs(16, torch), 2,
                              n_processes=2, n_prefetch=4, shuffle=False,
                              seed=seed, start_method=method,
                              worker_init_fn=helpers.record_worker_rngs) as it:
        first = [e for _ in range(8) for e in next(it)]
        assert [e[0] for e in first] == list(range(16))
        deadline = time.monotonic() + 60
        examples = first
        while True:
            for e in examples:
                assert found.setdefault(e[1], e[2:]) == e[2:]
            if len(found) == 2 or time.monotonic() > deadline:
                break
            examples = next(it)
    return found


def check_worker_rngs(method, torch):
    rngs = worker_rngs(method, 7, torch)
    assert sorted(rngs) == [0, 1]
    # torch as DataLoader seeds it (seed + worker id); random and numpy
    # differ by worker, forked ones too.
    expected = [None, None] if torch is None else [7, 8]
    assert [rngs[w][0] for w in (0, 1)] == expected
    assert rngs[0][1] != rngs[1][1] and rngs[0][2] != rngs[1][2]
    assert worker_rngs(method, 7, torch) == rngs      # repeatable
    other = worker_rngs(method, 9, torch)
    assert other[0][1:] != rngs[0][1:]
    if torch is not None:
        assert [other[w][0] for w in (0, 1)] == [9, 10]


def test_workers_seed_torch_random_and_numpy(method, monkeypatch):
    # Forked workers see the parent's modules, spawned ones import "torch"
    # with the dataset.
    monkeypatch.setitem(sys.modules, 'torch', helpers.FakeTorch())
    check_worker_rngs(method, 'fake')


# The seeding under each start method is test_workers_seed_torch_random_
# and_numpy's (a fake torch, imported with the dataset under forkserver and
# spawn); this one checks the real torch's API, once: under forkserver and
# spawn each worker imports the real torch (seconds), -m slow.
@pytest.mark.parametrize('method', helpers.start_methods_kept('fork'))
def test_workers_seed_the_real_torch(method):
    pytest.importorskip('torch')
    check_worker_rngs(method, 'real')


def test_workers_seed_random_and_numpy_and_never_import_torch(method):
    if 'torch' in sys.modules:
        pytest.skip('torch is imported in this test process')
    check_worker_rngs(method, None)


def global_draws(method, seed, **kwargs):
    """``[(worker id, incarnation, k, pid, worker seed, random's draw,
    numpy's draw)]`` of the examples of 30 batches of 4
    (``helpers.GlobalDraws``)."""
    dataset = kwargs.pop('dataset', None) or helpers.GlobalDraws(16)
    with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              seed=seed, start_method=method,
                              **kwargs) as it:
        examples = [e for _ in range(30) for e in next(it)]
    assert [e[0] for e in examples] == list(range(16)) * 7 + list(range(8))
    return [e[2:4] + (e[5], e[1], e[4]) + e[6:] for e in examples]


def draws_of_their_own(examples, replaced):
    """``{(worker id, incarnation, k): (worker seed, draws)}``, once it
    is checked that every draw of random and of numpy's global RNG
    differs (62 bits: a repeat is a replayed stream) and that
    ``get_worker_info()`` tells the workers apart: one process for each
    (id, incarnation), each with a seed of its own, ``replaced`` of them
    (at least) replacements."""
    for column in (5, 6):
        values = [e[column] for e in examples]
        assert len(set(values)) == len(values)
    workers = {}
    for worker_id, incarnation, _, pid, seed, _, _ in examples:
        assert workers.setdefault((worker_id, incarnation),
                                  (pid, seed)) == (pid, seed)
    assert {w for w, _ in workers} == {0, 1}
    assert len({seed for _, seed in workers.values()}) == len(workers)
    assert len({pid for pid, _ in workers.values()}) == len(workers)
    assert sum(1 for _, incarnation in workers if incarnation) >= replaced
    draws = {e[:3]: e[4:] for e in examples}
    assert len(draws) == len(examples)
    return draws


def test_replaced_workers_draw_numbers_of_their_own(method):
    # A dataset that augments with the global RNGs, and maxtasksperchild:
    # each replacement draws numbers of its own, the same ones for the
    # same seed; the first worker of each id is seeded as before.
    draws = draws_of_their_own(global_draws(method, 3, maxtasksperchild=3),
                               replaced=4)
    assert (draws[(0, 0, 0)][0], draws[(1, 0, 0)][0]) == (3, 4)  # seed + id
    again = draws_of_their_own(global_draws(method, 3, maxtasksperchild=3),
                               replaced=4)
    common = set(draws) & set(again)
    assert len(common) >= len(draws) // 2
    assert {key: draws[key] for key in common} == \
        {key: again[key] for key in common}


def test_a_worker_replaced_after_a_death_draws_numbers_of_its_own(
        method, tmp_path):
    # The worker that loads example 13 dies (once); the one that takes
    # its place (its id, incarnation 1) draws numbers of its own.
    dataset = helpers.GlobalDraws(16, kill_at=13,
                                  once_file=str(tmp_path / 'killed'))
    with pytest.warns(chainiter.WorkerRestartWarning, match='signal 9'):
        examples = global_draws(method, 3, dataset=dataset)
    draws_of_their_own(examples, replaced=1)


def test_maxtasksperchild_replaces_workers(method):
    dataset = Pids()
    with MultiprocessIterator(dataset, 4, n_processes=2, maxtasksperchild=1,
                              shuffle=False, start_method=method) as it:
        examples = [e for _ in range(6) for e in next(it)]
    assert [e[0] for e in examples] == list(range(12)) * 2
    assert len({e[1] for e in examples}) > 2
    assert wait_processes_gone({e[1] for e in examples}, timeout=10)


class ParentThreads:
    """Example i: (i, the number of threads of the worker's parent)."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        with open('/proc/{}/status'.format(os.getppid())) as f:
            threads = [line for line in f if line.startswith('Threads:')]
        return i, int(threads[0].split()[1])


def test_fork_workers_come_from_a_process_without_threads():
    # Forking a process that has threads may deadlock the child (Python
    # 3.12+ warns): every worker, the replacements that maxtasksperchild
    # asks for included, is forked by a launcher with one thread.
    with MultiprocessIterator(ParentThreads(), 4, n_processes=2,
                              maxtasksperchild=1, shuffle=False,
                              start_method='fork') as it:
        examples = [e for _ in range(6) for e in next(it)]
    assert [e[0] for e in examples] == list(range(12)) * 2
    assert {e[1] for e in examples} == {1}


class IdsAndLabel:
    """``([i, i + 1], label)``: a list field; label 6 is a float."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return [i, i + 1], 0.5 if i == 6 else i


class PartlyPadded:
    """``{'x': ragged array, 'y': float32 scalar}``."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {'x': numpy.arange(i % 3 + 1), 'y': numpy.float32(i)}


def _shifting_batches():
    """Batches of 4 bare examples; after the first two (Python ints),
    each batch differs in its own way from the layout they measured."""
    x = numpy.arange(3, dtype=numpy.float32)
    return [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 2.5, 10, 11],                   # a float among ints
        [numpy.int32(12), 13, 14, 15],      # a numpy int32 first
        [True, numpy.int64(17), 18, 19],    # a bool first
        [2 ** 63, 21, 22, 23],              # beyond int64
        [numpy.float32(24.5), 25.5, 26.5, 27.5],
        [{'a': x + i, 'b': i} for i in range(4)],      # dicts
        [(x[:1] + i, x + i) for i in range(4)],        # tuples
        [numpy.asarray(36), 37, 38, 39],    # an array, then ints: an error
    ]


class Shifting:
    """The examples of ``_shifting_batches``, one after another."""

    def __init__(self):
        self.examples = [e for batch in _shifting_batches() for e in batch]

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        return self.examples[i]


def _outcome(converter, examples):
    try:
        return helpers.describe(converter(examples))
    except Exception as e:
        return type(e)


@pytest.mark.parametrize('dataset,converter', [
    (IdsAndLabel(), concat_examples),
    (IdsAndLabel(), functools.partial(concat_examples, padding=0)),
    (PartlyPadded(), functools.partial(concat_examples, padding={'x': -1})),
    (Shifting(), concat_examples),
    (Shifting(), functools.partial(concat_examples, padding=0)),
], ids=['list-field-and-a-float-label', 'list-field-padded',
        'padding-for-some-keys', 'shifting', 'shifting-padded'])
def test_stacked_batches_equal_the_converter_of_the_list(method, dataset,
                                                         converter):
    # Whatever the workers wrote and the main process stacked, each batch
    # is the converter's of the examples (or its exception), never a cast.
    with MultiprocessIterator(dataset, 4, repeat=False, n_processes=2,
                              shuffle=False, converter=converter,
                              start_method=method) as it, \
            SerialIterator(dataset, 4, repeat=False, shuffle=False) as ref:
        with warnings.catch_warnings():
            # A batch that does not match the first one's layout may warn.
            warnings.simplefilter('ignore', chainiter.SharedMemoryWarning)
            for step, examples in enumerate(ref):
                expected = _outcome(converter, examples)
                assert _outcome(lambda _: next(it), None) == expected, step
                if type(expected) is type:
                    break       # the same batch would come again


def test_a_batch_a_forked_child_holds_is_never_overwritten(method):
    # The parent drops the batch and iterates on; a child forked while the
    # parent held it reads it later and must see what it was given.
    dataset = AugmentedDataset(64)
    with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              converter=concat_examples,
                              start_method=method) as it:
        next(it)                   # the first batch comes by copy
        batch = next(it)           # a view of shared memory
        base = batch[1]
        while isinstance(base, numpy.ndarray):
            base = base.base
        assert isinstance(base, ctypes.Array)
        del base
        verdict = helpers.fork_reader(batch)
        del batch
        gc.collect()
        for _ in range(30):        # slots are reused many times over
            next(it)
        assert verdict()


@pytest.mark.parametrize('converter', [concat_examples, None])
def test_forks_while_a_batch_is_held_keep_no_slot_once_it_is_dropped(
        method, converter, monkeypatch):
    # A fork while the user holds a batch retires its slot (never written
    # again: the child may read it); once the user drops the batch the
    # parent unmaps it, the child keeping its own mapping, so a fork at
    # every few batches leaves the parent's slots and descriptors flat
    # (each fork kept one more slot mapped, and two descriptors, until
    # finalize()).  Two children read their batch at the end, after
    # the parent has let go of it; the others at once, and exit.  Batches
    # one by one: groups beginning would change the slots meanwhile.
    monkeypatch.setattr(MultiprocessIterator, 'GROUP_AFTER', 10 ** 9)
    dataset = AugmentedDataset(64)
    with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              converter=converter,
                              start_method=method) as it, \
            SerialIterator(dataset, 4, shuffle=False) as ref:
        convert = converter or (lambda batch: batch)
        next(it)                   # the first batch comes by copy
        next(ref)
        later, counts = [], []
        for k in range(12):
            batch = next(it)
            assert fingerprint(batch) == fingerprint(convert(next(ref)))
            verdict = helpers.fork_reader(batch)
            del batch
            for _ in range(5):
                assert fingerprint(next(it)) == \
                    fingerprint(convert(next(ref)))
            if k < 2:
                later.append(verdict)
            else:
                assert verdict()
            counts.append((len(os.listdir('/proc/self/fd')),) +
                          helpers.mapped_buffers())
        assert all(verdict() for verdict in later)
    # (descriptors, slots mapped, slots' descriptors) after each fork but
    # the first two (their children hold two pipes each till the end): a
    # slot or two more as the pipeline may use, not one a fork.
    assert all(b - a <= 4 for a, b in zip(counts[2], counts[-1])), counts


def test_dataset_error_is_raised_with_worker_traceback(method):
    dataset = helpers.Failing(10, bad=5)
    with MultiprocessIterator(dataset, 3, n_processes=2, shuffle=False,
                              start_method=method) as it:
        next(it)
        with pytest.raises(KeyError, match='broken example 5') as info:
            next(it)
        assert 'Traceback' in str(info.value.__cause__)
        assert 'dataset[5]' in ''.join(getattr(info.value, '__notes__', [])) \
            or sys.version_info < (3, 11)
        assert it.current_position == 3
        with pytest.raises(KeyError):
            next(it)                 # retried, fails again


def test_oversize_example_delivered_intact_with_one_warning(method):
    dataset = helpers.Big(12, sizes=[10, 10, 10, 10, 5000, 10])
    with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              shared_mem=1024, start_method=method) as it, \
            SerialIterator(dataset, 4, shuffle=False) as ref:
        with pytest.warns(chainiter.SharedMemoryWarning,
                          match='shared_mem=') as record:
            for _ in range(6):
                assert fingerprint(next(it)) == fingerprint(next(ref))
    assert len([w for w in record
                if w.category is chainiter.SharedMemoryWarning]) == 1


def test_stacked_mode_follows_the_advice_of_the_size_warning(method):
    dataset = helpers.Big(12, sizes=[10, 10, 10, 10, 5000, 10])
    converter = functools.partial(concat_examples, padding=0)

    def run(shared_mem):
        with MultiprocessIterator(dataset, 4, n_processes=1, shuffle=False,
                                  shared_mem=shared_mem, converter=converter,
                                  start_method=method) as it, \
                SerialIterator(dataset, 4, shuffle=False) as ref, \
                warnings.catch_warnings(record=True) as record:
            warnings.simplefilter('always')
            shared = []
            for _ in range(6):
                got = next(it)
                assert_same_arrays(got, converter(next(ref)))
                shared.append(views_shared_memory(got[0]))
        return [str(w.message) for w in record], shared

    messages, _ = run(None)    # sized from the first batch: 10 values
    assert len(messages) == 1 and 'shared_mem=' in messages[0], messages
    advice = int(messages[0].split('shared_mem=')[1].split()[0])
    messages, shared = run(advice)
    assert messages == []
    assert shared[1:] == [True] * 5    # the first batch measures the shapes


def test_timeout_warning_when_dataset_stalls(method):
    dataset = helpers.Stalling(6, slow=4, seconds=1.5)
    with MultiprocessIterator(dataset, 2, n_processes=1, shuffle=False,
                              dataset_timeout=None,
                              start_method=method) as it:
        assert next(it) == [0, 1]    # may take long: a worker is starting
        it.dataset_timeout = 0.3
        with pytest.warns(MultiprocessIterator.TimeoutWarning):
            assert next(it) == [2, 3]
            assert next(it) == [4, 5]


def test_unpicklable_dataset_fails_before_workers_start(method):
    if method == 'fork':
        pytest.skip('fork does not pickle the dataset')
    # (Lambdas and closures go by value: test_notebook.py.)
    dataset = chainiter.datasets.TransformDataset([1, 2],
                                                  helpers.UnpicklableCall())
    with pytest.raises(TypeError, match=method + '.*refuses to be pickled'
                       '.*module level.*fork'):
        MultiprocessIterator(dataset, 1, start_method=method)
    with pytest.raises(TypeError, match='worker_init_fn'):
        MultiprocessIterator([1, 2], 1, start_method=method,
                             worker_init_fn=helpers.UnpicklableCall())


@pytest.mark.parametrize('how', ['finalize', 'with', 'gc'])
def test_no_process_and_no_file_left(method, how):
    before = shm_files()
    it = MultiprocessIterator(Pids(), 4, n_processes=2, n_prefetch=2,
                              start_method=method)
    pids = {e[1] for _ in range(3) for e in next(it)}
    if how == 'finalize':
        it.finalize()
        it.finalize()
    elif how == 'with':
        with it:
            next(it)
    else:
        del it
        gc.collect()
    assert wait_processes_gone(pids, timeout=10)
    assert shm_files() <= before


def test_interpreter_exit_without_finalize(method, tmp_path):
    before = shm_files()
    script = textwrap.dedent('''
        import sys
        sys.path.insert(0, {tests!r})
        import chainiter, helpers
        if __name__ == '__main__':
            it = chainiter.MultiprocessIterator(
                helpers.Pids(), 4, n_processes=2, n_prefetch=3,
                start_method={method!r})
            pids = {{e[1] for e in next(it)}}
            print(' '.join(map(str, pids)), flush=True)
    ''').format(tests=os.path.dirname(__file__), method=method)
    path = tmp_path / 'script.py'
    path.write_text(script)
    out = subprocess.run([sys.executable, str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ''
    pids = [int(p) for p in out.stdout.split()]
    assert pids and wait_processes_gone(pids, timeout=10)
    assert shm_files() <= before


SMALL_SHM_SCRIPT = '''
import sys, warnings
sys.path.insert(0, {tests!r})
import numpy, chainiter, helpers


def main():
    dataset = helpers.Big(16, sizes=[{size}])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        try:
            it = chainiter.MultiprocessIterator(
                dataset, 4, n_processes=2, shuffle=False,
                start_method={method!r}, converter=chainiter.concat_examples)
            ref = chainiter.SerialIterator(dataset, 4, shuffle=False)
            for _ in range(6):
                got, expected = next(it), chainiter.concat_examples(next(ref))
                assert all(numpy.array_equal(a, b)
                           for a, b in zip(got, expected))
            it.finalize()
            print('OK')
        except MemoryError as e:
            print('ERROR', e)
    for w in record:
        print('WARNING', w.category.__name__, w.message)


if __name__ == '__main__':
    main()
'''


@pytest.mark.parametrize('size', [30000, 10 ** 6])
def test_small_dev_shm(method, size, tmp_path):
    """/dev/shm of 1 MiB: buffers of ~1 MiB go to the temporary directory
    with a warning; buffers larger than every place fail clearly."""
    probe = subprocess.run(
        ['unshare', '--mount', 'sh', '-c',
         'mount -t tmpfs -o size=1M tmpfs /dev/shm'], capture_output=True)
    if probe.returncode != 0:
        pytest.skip('cannot make a private /dev/shm here: {}'.format(
            probe.stderr.decode().strip()))
    script = tmp_path / 'script.py'
    script.write_text(SMALL_SHM_SCRIPT.format(
        tests=os.path.dirname(__file__), method=method, size=size))
    tmp = tmp_path / 'tmp'
    tmp.mkdir()
    small_tmp = ''
    if size == 10 ** 6:   # make the temporary directory too small as well
        small_tmp = 'mount -t tmpfs -o size=1M tmpfs {} && '.format(tmp)
    out = subprocess.run(
        ['unshare', '--mount', 'sh', '-c',
         'mount -t tmpfs -o size=1M tmpfs /dev/shm && {}TMPDIR={} {} {}'
         .format(small_tmp, tmp, sys.executable, script)],
        capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    if size == 30000:
        assert 'OK' in out.stdout, out.stdout + out.stderr
        assert 'WARNING SharedMemoryWarning' in out.stdout
        assert 'bytes' in out.stdout and '/dev/shm' in out.stdout
    else:
        assert 'ERROR no room' in out.stdout, out.stdout + out.stderr
        assert 'free' in out.stdout


def test_bad_arguments():
    for kwargs in ({'n_processes': 0}, {'n_prefetch': 0},
                   {'shared_mem': -1}, {'maxtasksperchild': 0}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            MultiprocessIterator([1, 2], 1, **kwargs)
    with pytest.raises(ValueError, match='batch_size'):
        MultiprocessIterator([1, 2], 0)
    with pytest.raises(ValueError, match='empty'):
        MultiprocessIterator([], 1)


@pytest.mark.parametrize('start_method', ['sapwn', 'Spawn', '', 0])
def test_unknown_start_method_is_named_with_the_valid_ones(start_method):
    with pytest.raises(ValueError) as info:
        MultiprocessIterator([1, 2], 1, start_method=start_method)
    text = str(info.value)
    assert 'start_method' in text and repr(start_method) in text
    for valid in multiprocessing.get_all_start_methods():
        assert repr(valid) in text


@pytest.mark.parametrize('converter', [None, concat_examples],
                         ids=['list', 'stacked'])
def test_slots_are_reused_once_the_user_lets_go(method, converter):
    def arrays(batch):
        if converter is None:
            return [example[0] for example in batch]
        return list(batch)

    # The slots: as many as the deepest the iterator may tune to, + 2.
    slots = MultiprocessIterator.MAX_PREFETCH_PER_WORKER * 2 + 2
    with MultiprocessIterator(Examples(40, 'tuple'), 4, n_processes=2,
                              converter=converter,
                              start_method=method) as it:
        next(it)                       # measures the sizes
        depth = it.stats['prefetch']
        held = [next(it) for _ in range(slots + 6)]   # more than the slots
        assert not all(views_shared_memory(a)
                       for b in held for a in arrays(b)), \
            'with every slot held, batches must come by copy'
        del held
        for _ in range(depth):
            next(it)      # were dispatched (by copy) while slots were held
        for _ in range(6):
            batch = next(it)
            assert all(views_shared_memory(a) for a in arrays(batch))


class Numbers:
    """Example i is the int i: no arrays, so every batch travels through
    the pipe, as a large message when the batch is large."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def test_large_tasks_and_results_with_deep_prefetch(method):
    # Tasks of 20,000 indices fill a socket buffer in a few messages, and
    # so do the results.  While finished batches wait for the consumer the
    # receiver thread rests; a send that might block must wake it, or the
    # worker (writing a result) and next() (sending a task) wait on each
    # other for ever.
    with MultiprocessIterator(Numbers(100000), 20000, n_processes=1,
                              n_prefetch=8, shuffle=False,
                              start_method=method) as it:
        for step in range(12):
            batch = next(it)
            start = step % 5 * 20000
            assert batch == list(range(start, start + 20000))


# ---- the self-tuning depth (n_prefetch=None) -------------------------------

def _depth_after_first_batch(dataset, batch_size, n_processes, method,
                             **kwargs):
    with MultiprocessIterator(dataset, batch_size, n_processes=n_processes,
                              seed=0, converter=concat_examples,
                              start_method=method, **kwargs) as it, \
            SerialIterator(dataset, batch_size, seed=0) as ref:
        for _ in range(6):
            assert fingerprint(next(it)) == fingerprint(
                concat_examples(next(ref)))
        return it.stats['prefetch']


def test_default_depth_is_deep_for_small_batches(method):
    """Tiny batches go 16 per worker deep: the processes then rarely
    wait on each other."""
    depth = _depth_after_first_batch(Examples(200, 'tuple'), 4, 2, method)
    assert depth == 32


def test_default_depth_stays_shallow_for_big_batches(method):
    """Big batches go 2 per worker deep (DataLoader's default), even when
    the budget holds less; deeper only as far as ``prefetch_bytes`` holds
    the slots (depth + 2: the batch the user holds and the one being
    handed out)."""
    depth = _depth_after_first_batch(Megabyte(), 4, 2, method,
                                     prefetch_bytes=8 * 2 ** 20)
    # 2 per worker, over the budget (per CPU, if fewer: see below)
    assert depth == 2 * min(2, usable_cpus())
    depth = _depth_after_first_batch(Megabyte(), 4, 1, method,
                                     prefetch_bytes=40 * 2 ** 20)
    assert depth == 40 // 4 - 2              # the budget holds depth + 2


@pytest.fixture
def two_cpus(monkeypatch):
    """The iterator sees a machine of 2 CPUs (whatever this one has), so
    that "more workers than CPUs" stays a handful of workers anywhere.
    (Pinning the process instead would pin a forkserver started meanwhile,
    and every later worker of the session with it.)"""
    from chainiter.iterators.pipeline.processes import iterator
    monkeypatch.setattr(iterator, 'usable_cpus', lambda: 2)
    return 2


def test_more_workers_than_cpus_share_fewer_big_batches(method, two_cpus):
    """Past the budget, big batches go 2 per CPU deep, not 2 per worker:
    the workers then share each batch in chunks (all of them busy), and
    no slot is made that only the budget would have refused.  Batches too
    small to give every worker a chunk go deep enough that they do; a
    converter in the workers and maxtasksperchild take whole batches (2
    per worker)."""
    cpus = two_cpus
    n = 2 * cpus + 1
    assert _depth_after_first_batch(Megabyte(), 4, n, method,
                                    prefetch_bytes=2 ** 20) == 2 * cpus
    assert _depth_after_first_batch(Megabyte(), 1, n, method,
                                    prefetch_bytes=2 ** 20) == n
    assert _depth_after_first_batch(Megabyte(), 4, n, method,
                                    prefetch_bytes=2 ** 20,
                                    maxtasksperchild=100) == 2 * n


def test_explicit_n_prefetch_is_a_floor(method):
    """An explicit n_prefetch is the fewest batches in flight: below the
    self-tuned depth it changes nothing (small batches: 16 per worker);
    above it, the depth is n_prefetch, past what ``prefetch_bytes``
    holds and past 16 per worker too."""
    small = Examples(40, 'tuple')
    assert _depth_after_first_batch(small, 4, 2, method, n_prefetch=3) == \
        _depth_after_first_batch(small, 4, 2, method) == 32
    assert _depth_after_first_batch(small, 4, 2, method, n_prefetch=40) == 40
    # Big batches: 2 per worker (or CPU) fit the budget; the floor is 6.
    assert _depth_after_first_batch(Megabyte(), 4, 2, method,
                                    prefetch_bytes=8 * 2 ** 20,
                                    n_prefetch=6) == 6


def test_prefetch_bytes_is_checked():
    with pytest.raises(ValueError, match='prefetch_bytes'):
        MultiprocessIterator(Examples(4, 'tuple'), 2, prefetch_bytes=0)


def test_stats_count_batches_that_came_by_copy(method):
    """Held batches keep their slots: with all of them held, later batches
    come through the socket (slower), and the statistics say so."""
    dataset = Examples(64, 'tuple')
    # The slots: as many as the deepest the iterator may tune to, + 2.
    slots = MultiprocessIterator.MAX_PREFETCH_PER_WORKER + 2
    with MultiprocessIterator(dataset, 4, n_processes=1, seed=0,
                              converter=concat_examples,
                              start_method=method) as it:
        held = [next(it) for _ in range(slots + 6)]
        stats = it.stats
    assert stats['batches'] == len(held) == slots + 6
    # The first batch sizes the buffers and the one after it was already
    # on its way: both by copy; with every batch held, the slots are used
    # up and the rest come by copy too.
    assert stats['by_copy'] >= len(held) - slots


# ---- the PyTorch-style loop ------------------------------------------------

def test_one_epoch_views_and_resume_inside_them(method):
    """The views of MultiprocessIterator hand out SerialIterator's
    batches, and a snapshot taken inside one resumes in another kind."""
    dataset = Examples(10, 'tuple')
    with MultiprocessIterator(dataset, 4, n_processes=2, seed=5,
                              start_method=method) as it, \
            SerialIterator(dataset, 4, seed=5) as ref:
        assert len(it) == 3
        for epoch in range(3):
            view, expected = it.one_epoch(), ref.one_epoch()
            assert len(view) == len(expected)
            for got, want in zip(view, expected):
                assert fingerprint(got) == fingerprint(want)
            assert list(view) == [] and it.epoch == epoch + 1
        view = it.one_epoch()
        next(view)
        state = it.state_dict()
        rest = [fingerprint(b) for b in view]
    with SerialIterator(dataset, 4, seed=0) as resumed:
        resumed.load_state_dict(state)
        assert [fingerprint(b) for b in resumed.one_epoch()] == rest


# ---- stats ------------------------------------------------------------------

MP_STAT_KEYS = {'batches', 'examples', 'first_batch_s', 'wait_s',
                'wait_mean_s', 'elapsed_s', 'wait_fraction', 'examples_per_s',
                'timed_batches', 'ready', 'by_copy', 'prefetch',
                'worker_busy', 'worker_cpu_wait', 'workers_active',
                'batches_per_task', 'loads_in'}


def test_stats_of_an_input_bound_loop(method):
    with MultiprocessIterator(helpers.Slow(40, 0.01), 2, n_processes=1,
                              n_prefetch=1, seed=0,
                              start_method=method) as it:
        for _ in range(8):
            next(it)
        stats = it.stats
        verdict = chainiter.diagnose(it)
    assert set(stats) == MP_STAT_KEYS
    assert (stats['batches'], stats['examples']) == (8, 16)
    # The depth used: n_prefetch=1 is a floor, below the self-tuned depth
    # of small batches (16 per worker).
    assert stats['timed_batches'] == 7 and stats['prefetch'] == \
        MultiprocessIterator.MAX_PREFETCH_PER_WORKER
    assert 0 < stats['worker_busy'] <= 1
    assert stats['workers_active'] == 1
    assert stats['wait_fraction'] > 0.5
    assert verdict.startswith('input-bound: next() waited'), verdict


def _verdict_of_an_input_bound_loop(dataset, batches, **kwargs):
    with MultiprocessIterator(dataset, 4, seed=0, **kwargs) as it:
        for _ in range(batches):
            next(it)
        stats = it.stats
        verdict = chainiter.diagnose(it)
    assert verdict.startswith('input-bound'), verdict
    assert 0 < stats['worker_busy'] <= 1
    assert 0 <= stats['worker_cpu_wait'] <= 1
    return verdict


def test_one_worker_of_cpu_bound_examples_is_told_to_add_workers(method):
    # Its busy share read 0.5 to 0.7 here (what it does between chunks is
    # not timed), and the advice was n_prefetch.  On a loaded machine the
    # verdict may be that the figures are too noisy; never n_prefetch.
    verdict = _verdict_of_an_input_bound_loop(
        helpers.Burn(10 ** 5, 2e-4), 150, n_processes=1,
        converter=concat_examples, start_method=method)
    assert 'n_prefetch' not in verdict, verdict
    assert 'too noisy' in verdict or 'n_processes' in verdict or \
        'every CPU' in verdict, verdict


def test_sleeping_workers_with_one_batch_in_flight(method):
    # An I/O-bound dataset (the sleep is the workload) and a prefetch of
    # one batch for four workers: more prefetch or more workers both help.
    verdict = _verdict_of_an_input_bound_loop(
        helpers.Slow(10 ** 5, 1e-3), 15, n_processes=4, n_prefetch=1,
        converter=concat_examples, start_method=method)
    assert 'n_prefetch' in verdict or 'n_processes' in verdict or \
        'too noisy' in verdict or 'every CPU' in verdict, verdict


def test_stats_of_a_compute_bound_loop(method):
    with MultiprocessIterator(Examples(200, 'tuple'), 4, n_processes=1,
                              seed=0, converter=concat_examples,
                              start_method=method) as it:
        next(it)
        for _ in range(10):
            helpers.compute(0.03)       # the training step
            next(it)
        stats = it.stats
        verdict = chainiter.diagnose(it)
        it.reset_stats()
        assert it.stats['batches'] == 0 and it.stats['by_copy'] == 0
    assert (stats['batches'], stats['examples']) == (11, 44)
    assert stats['by_copy'] >= 1 and stats['ready'] >= 0
    assert verdict.startswith('compute-bound: next() waited'), verdict


class _Large:
    """Examples of 4 MiB: the first batch comes through the socket, in
    many reads."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return numpy.full(2 ** 20, i, dtype=numpy.float32)


def test_results_arrive_when_the_process_has_over_1024_descriptors(method):
    # select() refuses a descriptor numbered 1024 or more; a program with
    # many files open gives the pool's sockets such numbers.
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip('the hard limit of descriptors is {}'.format(hard))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with MultiprocessIterator(_Large(), 2, n_processes=2,
                                  shuffle=False, start_method=method) as it:
            for k in range(4):
                batch = next(it)
                assert [int(x[0]) for x in batch] == [2 * k, 2 * k + 1]
                assert all((x == x[0]).all() for x in batch)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
