"""Sharding and ChainerMN's API, in one process: the share arithmetic as
properties over many (N, ranks, batch, repeat), every rank simulated by its
own iterator; real ranks under mpiexec are in test_mpi.py."""

import itertools
import threading

import numpy
import pytest

import chainiter
from chainiter import SnapshotMismatchError
from chainiter import distributed
from chainiter.iterators import _shard, _state, order_samplers

from helpers import restore, snapshot


class KeyedDataset:
    """Example i is (i, a number drawn from example_rng()): equal batches
    mean equal indices and equal example_rng() keys."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return int(i), int(chainiter.example_rng().integers(2 ** 62))


def _global_steps(n, size, batch, repeat, n_steps, seed=3):
    """Per global step: the (epoch, position, index) rows of each rank,
    from the pure layer (advance + shard_step)."""
    order = order_samplers.SeededPermutation(seed, 0, n)
    state = _state.IteratorState(0, 0, False, order)
    steps = []
    for _ in range(n_steps):
        before = state
        state, step = _state.advance(
            state, size * batch, repeat, n,
            lambda o, p, e: (order_samplers.SeededPermutation(seed, e, n),
                             None))
        if step is None:
            break
        ranks = []
        for rank in range(size):
            local, padding = _shard.shard_step(
                step, _shard.Shard(rank, size), before.order, n)
            rows = list(zip(local.epochs.tolist(), local.positions.tolist(),
                            local.indices.tolist()))
            ranks.append((rows, padding))
        steps.append(ranks)
    return steps, state


COMBOS = [(n, size, batch) for n in (1, 2, 5, 7, 12, 23)
          for size in (1, 2, 3, 4) for batch in (1, 2, 3, 5)]


@pytest.mark.parametrize('n,size,batch', COMBOS)
def test_repeat_every_rank_gets_batch_rows_and_each_epoch_once(n, size,
                                                               batch):
    n_steps = -(-3 * n // (size * batch)) + 1
    steps, _ = _global_steps(n, size, batch, True, n_steps)
    seen = {}
    for ranks in steps:
        for rows, padding in ranks:
            assert len(rows) == batch and padding == 0
            for epoch, position, index in rows:
                key = (epoch, position)
                assert key not in seen       # disjoint, over ranks and steps
                seen[key] = index
    for epoch in range(3):                   # complete: every position
        indices = [seen[(epoch, p)] for p in range(n)]
        assert sorted(indices) == list(range(n))
        assert indices == order_samplers.seeded_order(3, epoch, n).tolist()


@pytest.mark.parametrize('n,size,batch', COMBOS + [(0, 2, 3), (3, 5, 2)])
def test_no_repeat_equal_shares_whole_epoch_padding_only_at_the_end(
        n, size, batch):
    steps, _ = _global_steps(n, size, batch, False, n + 2)
    assert len(steps) == -(-n // (size * batch))
    order = order_samplers.seeded_order(3, 0, n).tolist()
    stream = []
    for k, ranks in enumerate(steps):
        lengths = {len(rows) for rows, _ in ranks}
        assert len(lengths) == 1             # the same count on every rank
        if k < len(steps) - 1:
            assert lengths == {batch}
        for rows, padding in ranks:
            stream.extend(rows)
    m = n - (len(steps) - 1) * size * batch if steps else 0
    missing = size * -(-m // size) - m
    assert missing < size
    # The epoch in order, then the padding: the epoch's start again.
    expected = [(0, p, order[p]) for p in range(n)] + \
        [(0, p % n, order[p % n]) for p in range(missing)]
    assert stream == expected
    if steps:
        assert sum(padding for _, padding in steps[-1]) == missing


@pytest.mark.parametrize('kind', ['serial', 'thread'])
@pytest.mark.parametrize('repeat', [True, False])
@pytest.mark.parametrize('n,size,batch', [(23, 2, 3), (23, 3, 4), (5, 4, 2),
                                          (12, 3, 2)])
def test_ranks_together_give_the_serial_iterators_batches(kind, repeat, n,
                                                          size, batch):
    make = {'serial': chainiter.SerialIterator,
            'thread': chainiter.MultithreadIterator}[kind]
    dataset = KeyedDataset(n)
    reference = chainiter.SerialIterator(dataset, size * batch,
                                         repeat=repeat, seed=5)
    ranks = [make(dataset, batch, repeat=repeat, seed=5, shard=(r, size))
             for r in range(size)]
    for _ in range(3 * n // (size * batch) + 3):
        try:
            expected = next(reference)
        except StopIteration:
            for it in ranks:
                with pytest.raises(StopIteration):
                    next(it)
            break
        got = [next(it) for it in ranks]
        joined = [row for part in got for row in part]
        pads = sum(it.padding for it in ranks)
        assert joined[:len(joined) - pads] == expected
        for it in ranks:
            assert it.epoch == reference.epoch
            assert it.is_new_epoch == reference.is_new_epoch
            assert it.epoch_detail == reference.epoch_detail
            assert it.current_position == reference.current_position
            assert it.global_batch_size == size * batch
            assert it.state_dict()['current_position'] == \
                reference.current_position
    else:
        assert repeat
    for it in ranks:
        it.finalize()


ELASTIC = [
    # (n, ranks before, batch before, ranks after, batch after, k steps)
    (23, 2, 3, 3, 3, 2), (23, 2, 3, 3, 2, 5), (23, 3, 2, 2, 5, 1),
    (7, 2, 2, 3, 1, 4), (12, 4, 3, 1, 5, 1), (5, 1, 3, 4, 2, 3),
    (10, 2, 5, 2, 5, 1), (10, 3, 3, 2, 4, 0),
]


def _flat(ranks_batches):
    return [row for part in ranks_batches for row in part]


def _step_all(iterators):
    """One step on every rank: their batches, or None where all stop
    (a rank stopping alone fails the test)."""
    batches = []
    for it in iterators:
        try:
            batches.append(next(it))
        except StopIteration:
            batches.append(None)
    if all(b is None for b in batches):
        return None
    assert None not in batches
    return batches


@pytest.mark.parametrize('repeat', [True, False])
@pytest.mark.parametrize('n,r1,b1,r2,b2,k', ELASTIC)
def test_elastic_resume_continues_the_stream_without_loss_or_repeat(
        repeat, n, r1, b1, r2, b2, k):
    dataset = KeyedDataset(n)
    # The uninterrupted stream, one example a step.
    reference = chainiter.SerialIterator(dataset, 1, repeat=repeat, seed=9)
    expected = list(itertools.islice(
        (row for batch in reference for row in batch), 3 * n))
    before = [chainiter.SerialIterator(dataset, b1, repeat=repeat, seed=9,
                                       shard=(r, r1)) for r in range(r1)]
    stream = []
    padding = 0
    for _ in range(k):
        got = _step_all(before)
        if got is None:
            break
        stream.extend(_flat(got))
        padding = sum(it.padding for it in before)
    states = [it.state_dict() for it in before]
    assert all(s == states[0] for s in states)   # the same on every rank
    saved = snapshot(before[0], 'npz')
    after = [restore(chainiter.MultithreadIterator(
        dataset, b2, repeat=repeat, seed=9, shard=(r, r2)), saved, 'npz')
        for r in range(r2)]
    while len(stream) < len(expected):
        got = _step_all(after)
        if got is None:
            break
        padding = sum(it.padding for it in after)
        stream.extend(_flat(got))
    if repeat:
        assert stream[:len(expected)] == expected
    else:
        assert len(stream) - padding == n
        assert stream[:n] == expected
        assert stream[n:] == expected[:padding]
    for it in after:
        it.finalize()


def test_snapshot_records_the_global_batch_and_loads_unsharded():
    dataset = KeyedDataset(11)
    it = chainiter.SerialIterator(dataset, 2, seed=1, shard=(1, 3))
    next(it)
    state = it.state_dict()
    assert state['shard_size'] == 3 and state['global_batch_size'] == 6
    assert state['current_position'] == 6
    plain = chainiter.SerialIterator(dataset, 6, seed=1)
    plain.load_state_dict(state)
    reference = chainiter.SerialIterator(dataset, 6, seed=1)
    next(reference)
    assert next(plain) == next(reference)
    assert 'shard_size' not in plain.state_dict()


def test_snapshot_mismatches_say_what_differs():
    dataset = KeyedDataset(11)
    it = chainiter.SerialIterator(dataset, 2, seed=1, shard=(0, 2))
    next(it)
    state = it.state_dict()
    other = chainiter.SerialIterator(dataset, 2, seed=2, shard=(0, 2))
    with pytest.raises(SnapshotMismatchError, match='seed 1.*seed=2'):
        other.load_state_dict(state)
    assert other.current_position == 0        # left as it was
    shorter = chainiter.SerialIterator(KeyedDataset(10), 2, seed=1,
                                       shard=(0, 2))
    with pytest.raises(SnapshotMismatchError, match='length 11.*length 10'):
        shorter.load_state_dict(state)
    for bad, message in [
            (dict(state, global_batch_size=5), 'shard_size 2 and global'),
            (dict(state, shard_size=0), 'shard_size 0'),
            ({k: v for k, v in state.items() if k != 'shard_size'},
             "'global_batch_size' but not 'shard_size'")]:
        fresh = chainiter.SerialIterator(dataset, 2, shard=(1, 2), seed=1)
        with pytest.raises(SnapshotMismatchError, match=message):
            fresh.load_state_dict(bad)
        assert fresh.current_position == 0


def test_shard_arguments_are_checked():
    dataset = KeyedDataset(4)
    with pytest.raises(ValueError, match='same seed on every rank'):
        chainiter.SerialIterator(dataset, 2, shard=(0, 2))
    chainiter.SerialIterator(dataset, 2, shard=(0, 1))   # one rank: no need
    with pytest.raises(ValueError, match=r'rank must be an int in \[0, 2\)'):
        chainiter.SerialIterator(dataset, 2, seed=0, shard=(2, 2))
    with pytest.raises(ValueError, match='shard size'):
        chainiter.SerialIterator(dataset, 2, seed=0, shard=(0, 0))
    with pytest.raises(ValueError, match='two ints'):
        chainiter.SerialIterator(dataset, 2, seed=0, shard=(0, 1, 2))
    with pytest.raises(ValueError, match="'auto'"):
        chainiter.SerialIterator(dataset, 2, seed=0, shard='mpi')
    with pytest.raises(TypeError, match='communicator'):
        chainiter.SerialIterator(dataset, 2, seed=0, shard=object())


@pytest.mark.parametrize('names', _shard.LAUNCHER_VARIABLES)
def test_rank_and_size_from_each_launcher(names):
    rank_name, size_name = names
    assert distributed.from_environment({rank_name: '2', size_name: '3'}) \
        == (2, 3)
    with pytest.raises(ValueError, match='but not ' + size_name):
        distributed.from_environment({rank_name: '1'})
    with pytest.raises(ValueError, match=rank_name):
        distributed.from_environment({rank_name: '3', size_name: '3'})


def test_launchers_in_order_and_one_process_without_any():
    assert distributed.from_environment({}) == (0, 1)
    both = {'PMI_RANK': '1', 'PMI_SIZE': '2', 'SLURM_PROCID': '0',
            'SLURM_NTASKS': '1'}
    assert distributed.from_environment(both) == (1, 2)


def test_shard_auto_reads_the_environment(monkeypatch):
    for names in _shard.LAUNCHER_VARIABLES:
        for name in names:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('RANK', '1')
    monkeypatch.setenv('WORLD_SIZE', '2')
    it = chainiter.SerialIterator(list(range(8)), 2, seed=0, shard='auto')
    assert it.shard == (1, 2)
    both = chainiter.SerialIterator(list(range(8)), 4, seed=0)
    assert next(it) == next(both)[2:]
    with pytest.raises(ValueError, match='same seed'):
        chainiter.SerialIterator(list(range(8)), 2, shard='auto')


def _clear_launchers(monkeypatch):
    for names in _shard.LAUNCHER_VARIABLES:
        for name in names:
            monkeypatch.delenv(name, raising=False)
    for name in ('SLURM_JOB_ID', 'SLURM_STEP_ID', 'SLURM_PROCID',
                 'SLURM_NTASKS', 'SLURM_STEP_NUM_TASKS'):
        monkeypatch.delenv(name, raising=False)


def test_shard_auto_in_a_slurm_batch_script_is_one_process(monkeypatch):
    # `#SBATCH --ntasks=4` then a plain `python train.py`: Slurm sets
    # SLURM_PROCID=0 and SLURM_NTASKS=4 in the batch step, which is one
    # process, not rank 0 of 4; only the tasks of an srun step are ranks.
    _clear_launchers(monkeypatch)
    monkeypatch.setenv('SLURM_JOB_ID', '7')
    monkeypatch.setenv('SLURM_PROCID', '0')
    monkeypatch.setenv('SLURM_NTASKS', '4')
    with pytest.warns(UserWarning, match=r'batch script(.|\n)*srun'):
        it = chainiter.SerialIterator(list(range(8)), 2, seed=0,
                                      shard='auto')
    assert it.shard == (0, 1)
    assert next(it) == next(chainiter.SerialIterator(list(range(8)), 2,
                                                     seed=0))
    batch = {'SLURM_JOB_ID': '7', 'SLURM_PROCID': '0', 'SLURM_NTASKS': '4'}
    # The batch step's own id, where a Slurm release sets it, keeps it one
    # process even with an srun step's variables inherited from sbatch's
    # caller.
    for special in ('-5', '4294967291', '4294967294', 'batch', 'extern'):
        with pytest.warns(UserWarning, match='batch script'):
            assert distributed.from_environment(dict(
                batch, SLURM_STEP_ID=special,
                SLURM_STEP_NUM_TASKS='4')) == (0, 1)
    # salloc's shell, without an interactive step: no SLURM_PROCID.
    with pytest.warns(UserWarning, match='SLURM_NTASKS=.4.'):
        assert distributed.from_environment(
            {'SLURM_JOB_ID': '7', 'SLURM_NTASKS': '4'}) == (0, 1)
    # One task: nothing to warn about.
    assert distributed.from_environment(
        dict(batch, SLURM_NTASKS='1')) == (0, 1)
    # A task other than 0 without the step's size is not a batch script.
    with pytest.raises(ValueError, match='SLURM_PROCID=.1.(.|\n)*'
                                         'SLURM_STEP_NUM_TASKS'):
        distributed.from_environment(dict(batch, SLURM_PROCID='1'))


def test_a_task_of_an_srun_step_gets_its_rank_in_the_step():
    # `srun python train.py` in that job: task 2 of the step's 4.
    step = {'SLURM_JOB_ID': '7', 'SLURM_STEP_ID': '0', 'SLURM_PROCID': '2',
            'SLURM_NTASKS': '4', 'SLURM_STEP_NUM_TASKS': '4'}
    assert distributed.from_environment(step) == (2, 4)
    # `srun --preserve-env -n 2` keeps the job's SLURM_NTASKS=4: the step
    # has 2 tasks, so rank 1 of 2 (not 1 of 4, which left half the data
    # unloaded).
    assert distributed.from_environment(
        dict(step, SLURM_PROCID='1', SLURM_STEP_NUM_TASKS='2')) == (1, 2)
    # `srun -n 1` (or salloc's interactive step): one process, no warning.
    assert distributed.from_environment(
        dict(step, SLURM_PROCID='0', SLURM_NTASKS='1',
             SLURM_STEP_NUM_TASKS='1')) == (0, 1)
    # salloc's shell (its interactive step, started --preserve-env, keeps
    # the job's SLURM_NTASKS): one process, as a batch script.
    with pytest.warns(UserWarning, match='salloc'):
        assert distributed.from_environment(
            dict(step, SLURM_STEP_ID='4294967290', SLURM_PROCID='0',
                 SLURM_STEP_NUM_TASKS='1')) == (0, 1)


def test_multiprocess_shard_keeps_keys_and_worker_info(method):
    dataset = WorkerKeyedDataset(13)
    reference = chainiter.SerialIterator(KeyedDataset(13), 6, seed=4)
    with chainiter.MultiprocessIterator(
            dataset, 3, seed=4, shard=(1, 2), n_processes=2,
            start_method=method) as it:
        for _ in range(5):
            expected = next(reference)[3:]
            got = next(it)
            assert [(i, r) for i, r, _ in got] == expected
            # The ranks' workers seed their global generators apart.
            seed = order_samplers.rank_seed(4, 1)
            assert {s for _, _, s in got} <= {seed, seed + 1}
            assert seed not in (4, order_samplers.rank_seed(4, 0))
            assert it.epoch == reference.epoch


class WorkerKeyedDataset(KeyedDataset):
    def __getitem__(self, i):
        info = chainiter.get_worker_info()
        return int(i), int(chainiter.example_rng().integers(2 ** 62)), \
            None if info is None else info.seed


# ---- ChainerMN's API with a stand-in communicator --------------------------


class FakeComm:
    """One rank of an mpi4py-like communicator whose broadcasts come from a
    log the root wrote first (run the root's part before the others')."""

    def __init__(self, log, rank, size):
        self.log, self.rank_, self.size_, self.read = log, rank, size, 0

    def Get_rank(self):
        return self.rank_

    def Get_size(self):
        return self.size_

    def _bcast(self, obj, root, copy):
        if self.rank_ == root:
            self.log.append(copy(obj))
            return obj
        self.read += 1
        return self.log[self.read - 1]

    def bcast(self, obj, root=0):
        return self._bcast(obj, root, lambda x: x)

    def Bcast(self, buffer, root=0):
        got = self._bcast(buffer, root, numpy.copy)
        buffer[...] = got


def _world(size):
    log = []
    return [FakeComm(log, r, size) for r in range(size)]


@pytest.mark.parametrize('force', [True, False])
def test_share_bounds_as_chainermn(force):
    for n, size in itertools.product(range(0, 30), range(1, 7)):
        bounds = distributed.share_bounds(n, size, force)
        covered = [i for b, e in bounds for i in range(b, e)]
        assert set(covered) == set(range(n))
        assert all(0 <= b <= e <= n for b, e in bounds)
        lengths = [e - b for b, e in bounds]
        if force:
            assert set(lengths) == {-(-n // size)}
        else:
            assert len(covered) == n and max(lengths) - min(lengths) <= 1


@pytest.mark.parametrize('root', [0, 2])
@pytest.mark.parametrize('shuffle', [False, True])
def test_scatter_dataset_from_the_root(root, shuffle):
    dataset = list(range(100, 117))
    comms = _world(3)
    ranks = [root] + [r for r in range(3) if r != root]
    shares = {}
    for r in ranks:
        shares[r] = distributed.scatter_dataset(
            dataset if r == root else None, comms[r], root=root,
            shuffle=shuffle, seed=7, max_buf_len=16)   # in pieces
    order = numpy.random.RandomState(7).permutation(17) if shuffle else \
        numpy.arange(17)
    for r in range(3):
        b, e = distributed.share_bounds(17, 3)[r]
        assert list(shares[r]) == [dataset[i] for i in order[b:e]]
    comms = _world(3)
    got = [distributed.scatter_index(17 if r == 0 else None, comms[r],
                                     force_equal_length=False)
           for r in range(3)]
    assert got == [(0, 6), (6, 12), (12, 17)]


def test_create_synchronized_iterator_gives_rank_0s_batches():
    comms = _world(4)
    dataset = KeyedDataset(10)
    its = [chainiter.SerialIterator(dataset, 4, seed=r) for r in range(3)]
    its.append(chainiter.SerialIterator(
        dataset, 4, order_sampler=chainiter.ShuffleOrderSampler()))
    its = [distributed.create_synchronized_iterator(it, comm)
           for it, comm in zip(its, comms)]
    assert [it.seed for it in its] == [0, 0, 0, 0]
    reference = chainiter.SerialIterator(dataset, 4, seed=0)
    for _ in range(5):
        batches = [next(it) for it in its[:3]]
        assert batches[0] == batches[1] == batches[2] == next(reference)
    # An order sampler is replaced by one seeded from rank 0's seed.
    again = chainiter.SerialIterator(
        dataset, 4, order_sampler=chainiter.ShuffleOrderSampler(
            numpy.random.RandomState(0)), seed=0)
    assert next(its[3]) == next(again)
    with pytest.raises(ValueError, match='order_sampler'):
        distributed.create_synchronized_iterator(object(), comms[0])


# ---- ranks in threads: collectives that need every rank at once ----------


class ThreadComm:
    """One rank of an mpi4py-like communicator whose ranks are threads of
    this process (``ThreadWorld.run``): each collective meets at a barrier,
    so that allgather works, which FakeComm's root-first log cannot do."""

    def __init__(self, world, rank):
        self.world, self.rank_ = world, rank

    def Get_rank(self):
        return self.rank_

    def Get_size(self):
        return self.world.size

    def allgather(self, obj):
        world = self.world
        world.barrier.wait()        # every rank read the last collective
        world.slots[self.rank_] = obj
        world.barrier.wait()
        if self.rank_ == 0:
            world.collectives += 1
        return list(world.slots)

    def bcast(self, obj, root=0):
        return self.allgather(obj)[root]


class ThreadChainerMNComm:
    """A ChainerMN-like communicator over a ThreadComm: ``bcast_obj`` and
    ``gather_obj``, and ``mpi_comm`` where ``with_mpi_comm``."""

    def __init__(self, inner, with_mpi_comm):
        self.rank, self.size, self._inner = \
            inner.Get_rank(), inner.Get_size(), inner
        if with_mpi_comm:
            self.mpi_comm = inner

    def bcast_obj(self, obj, max_buf_len=256 * 1024 * 1024, root=0):
        return self._inner.bcast(obj, root)

    def gather_obj(self, obj, root=0):
        every = self._inner.allgather(obj)
        return every if self.rank == root else None


class ThreadWorld:
    def __init__(self, size):
        self.size = size
        # A rank that never joins a collective breaks it, in seconds.
        self.barrier = threading.Barrier(size, timeout=10)
        self.slots = [None] * size
        self.collectives = 0

    def run(self, build):
        """``build(comm)`` on every rank, each in a thread: what each
        returned or raised, in rank order."""
        out = [None] * self.size

        def rank(r):
            try:
                out[r] = build(ThreadComm(self, r))
            except Exception as e:
                out[r] = e

        threads = [threading.Thread(target=rank, args=(r,))
                   for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        return out


def test_sharded_iterator_with_a_communicator_gets_rank_0s_seed():
    world = ThreadWorld(2)
    numpy.random.seed(0)     # each rank draws its own seed; rank 0's wins
    its = world.run(lambda comm: chainiter.SerialIterator(
        KeyedDataset(9), 2, shard=comm))
    assert its[0].seed == its[1].seed and its[1].shard == (1, 2)
    assert world.collectives == 1        # the only message
    both = chainiter.SerialIterator(KeyedDataset(9), 4, seed=its[0].seed)
    assert next(its[0]) + next(its[1]) == next(both)
    given = world.run(lambda comm: chainiter.SerialIterator(
        KeyedDataset(9), 2, seed=3, shard=comm))
    assert [it.seed for it in given] == [3, 3] and world.collectives == 2


def test_ranks_of_a_communicator_with_different_seeds_raise():
    # seed=1234 + rank, a common habit, made the shares of 40 examples
    # overlap (9 loaded twice, 9 never); every rank now raises, naming the
    # seeds, after the one collective.
    world = ThreadWorld(2)
    got = world.run(lambda comm: chainiter.SerialIterator(
        KeyedDataset(40), 4, seed=1234 + comm.Get_rank(), shard=comm))
    for error in got:
        assert isinstance(error, ValueError), error
        message = str(error)
        assert 'seed' in message and '1234 on rank 0' in message and \
            '1235 on rank 1' in message, message
    assert str(got[0]) == str(got[1])
    # A seed on some ranks and None on others: the same.
    got = world.run(lambda comm: chainiter.SerialIterator(
        KeyedDataset(40), 4, seed=5 if comm.Get_rank() else None,
        shard=comm))
    assert all(isinstance(e, ValueError) and 'None on rank 0' in str(e)
               and '5 on rank 1' in str(e) for e in got), got


@pytest.mark.parametrize('kind', range(3))
def test_ranks_of_a_communicator_must_agree_on_batch_and_length(kind):
    world = ThreadWorld(3)
    make = [chainiter.SerialIterator, chainiter.MultithreadIterator,
            chainiter.MultiprocessIterator][kind]
    extra = {'n_processes': 1} if kind == 2 else {}
    got = world.run(lambda comm: make(
        KeyedDataset(40), 4 + (comm.Get_rank() == 2), seed=1,
        shard=comm, **extra))
    for error in got:
        assert isinstance(error, ValueError), error
        assert 'batch_size (4 on ranks 0, 1; 5 on rank 2)' in str(error)
        assert 'seed (' not in str(error)
    got = world.run(lambda comm: make(
        KeyedDataset(40 - comm.Get_rank()), 4, shard=comm, **extra))
    for error in got:
        assert isinstance(error, ValueError), error
        assert 'len(dataset) (40 on rank 0; 39 on rank 1; 38 on rank 2)' \
            in str(error), str(error)


@pytest.mark.parametrize('with_mpi_comm', [True, False])
def test_chainermn_communicators_agree_too(with_mpi_comm):
    world = ThreadWorld(2)
    its = world.run(lambda comm: chainiter.SerialIterator(
        KeyedDataset(9), 2, shard=ThreadChainerMNComm(comm, with_mpi_comm)))
    assert its[0].seed == its[1].seed and its[1].shard == (1, 2)
    both = chainiter.SerialIterator(KeyedDataset(9), 4, seed=its[0].seed)
    assert next(its[0]) + next(its[1]) == next(both)
    got = world.run(lambda comm: chainiter.SerialIterator(
        KeyedDataset(9), 2, seed=comm.Get_rank(),
        shard=ThreadChainerMNComm(comm, with_mpi_comm)))
    assert all(isinstance(e, ValueError) for e in got), got


class FakeChainerMNComm:
    """One rank of a ChainerMN-like communicator (rank, size, bcast_obj),
    over the same root-first log as FakeComm."""

    def __init__(self, log, rank, size):
        self.rank, self.size = rank, size
        self._inner = FakeComm(log, rank, size)
        self.buffer_lengths = []

    def bcast_obj(self, obj, max_buf_len=256 * 1024 * 1024, root=0):
        self.buffer_lengths.append(max_buf_len)
        return self._inner.bcast(obj, root)


def test_chainermn_communicators_scatter_too():
    log = []
    comms = [FakeChainerMNComm(log, r, 2) for r in range(2)]
    shares = [distributed.scatter_dataset(
        list(range(7)) if r == 0 else None, comms[r], max_buf_len=100)
        for r in range(2)]
    assert [list(s) for s in shares] == [[0, 1, 2, 3], [3, 4, 5, 6]]
    assert comms[1].buffer_lengths[0] == 100


@pytest.mark.parametrize('repeat', [True, False])
@pytest.mark.parametrize('size', [1, 2, 3])
def test_len_one_epoch_and_stats_count_this_ranks_steps(size, repeat):
    # 23 examples, 4 per rank and step: ceil(23 / (4 * size)) steps an
    # epoch on every rank, and stats count the rows this rank received.
    n, batch = 23, 4
    steps = -(-n // (batch * size))
    for rank in range(size):
        with chainiter.SerialIterator(list(range(n)), batch, repeat=repeat,
                                      seed=3, shard=(rank, size)) as it:
            assert len(it) == steps
            view = it.one_epoch()
            assert len(view) == steps
            got = list(view)
            assert len(got) == steps
            assert it.stats['examples'] == sum(len(b) for b in got)
            assert it.stats['batches'] == steps
