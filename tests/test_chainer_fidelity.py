"""Chainer 7's behaviours that Chainer code relies on, for every iterator
kind (the multiprocess one under every start method).  The differential
tests against a real Chainer are in test_chainer_differential.py."""

import copy
import functools
import io
import pickle

import numpy
import pytest

import chainiter
from chainiter import MultiprocessIterator, MultithreadIterator, SerialIterator

import helpers
from helpers import START_METHODS, AugmentedDataset, fingerprint

KINDS = dict(
    [('serial', SerialIterator),
     ('thread', functools.partial(MultithreadIterator, n_threads=2))]
    + [('mp-' + m, functools.partial(MultiprocessIterator, n_processes=2,
                                     start_method=m))
       for m in START_METHODS])


@pytest.fixture(params=list(KINDS))
def make(request):
    return KINDS[request.param]


def attributes(it):
    return (it.epoch, it.current_position, it.is_new_epoch, it.epoch_detail,
            it.previous_epoch_detail)


# ---- previous_epoch_detail on the stopping call ---------------------------

def test_previous_epoch_detail_is_updated_by_the_stopping_call(make):
    with make(list(range(5)), 2, repeat=False, shuffle=False) as it:
        assert [next(it) for _ in range(3)] == [[0, 1], [2, 3], [4]]
        assert it.previous_epoch_detail == pytest.approx(4 / 5)
        assert it.epoch_detail == 1.0
        with pytest.raises(StopIteration):
            next(it)
        # Chainer sets it to the final epoch_detail before stopping.
        assert it.previous_epoch_detail == it.epoch_detail == 1.0
        with pytest.raises(StopIteration):
            next(it)
        assert it.previous_epoch_detail == 1.0


# ---- order samplers whose order is not len(dataset) long ------------------

class Oversample:
    """Every example twice, in a fixed order (Chainer's test of the epoch
    size), counting its calls."""

    def __call__(self, order, position):
        return numpy.repeat(numpy.arange(3), 2)


class Balanced:
    """A stateful sampler with an order of 8 indices into a dataset of 5:
    index 0 (a rare class) four times, the others once."""

    def __init__(self, seed):
        self.random = numpy.random.RandomState(seed)

    def __call__(self, order, position):
        return self.random.permutation([0, 0, 0, 0, 1, 2, 3, 4])

    def serialize(self, serializer):
        chainiter.ShuffleOrderSampler(self.random).serialize(serializer)


def test_epoch_is_as_long_as_the_order(make):
    with make([1, 2, 3], 2, order_sampler=Oversample()) as it:
        assert it.epoch_size == 6
        for epoch in range(2):
            batches = [next(it) for _ in range(3)]
            assert sorted(sum(batches, [])) == [1, 1, 2, 2, 3, 3]
            assert it.is_new_epoch and it.epoch == epoch + 1
            assert it.epoch_detail == epoch + 1
            assert it.previous_epoch_detail == pytest.approx(epoch + 4 / 6)
        next(it)
        assert it.current_position == 2
        assert it.epoch_detail == pytest.approx(2 + 2 / 6)


def test_no_repeat_epoch_as_long_as_the_order(make):
    with make([1, 2, 3], 4, repeat=False, order_sampler=Oversample()) as it:
        assert list(it) == [[1, 1, 2, 2], [3, 3]]
        assert it.previous_epoch_detail == 1.0


def test_an_order_of_another_length_later_is_a_value_error(make):
    lengths = iter([6, 6, 5])

    def sampler(order, position):
        return numpy.arange(next(lengths)) % 3

    with make([1, 2, 3], 3, order_sampler=sampler) as it:
        next(it)
        next(it)        # the second epoch's order: still 6 long
        next(it)
        before = attributes(it)
        with pytest.raises(ValueError, match='size of order'):
            next(it)    # the third epoch's order has 5
        assert attributes(it) == before     # left as it was


def test_oversampled_snapshots_resume_exactly():
    dataset = AugmentedDataset(5)
    helpers.assert_resume_equivalent(
        lambda: SerialIterator(dataset, 3, order_sampler=Balanced(7), seed=1),
        [lambda: SerialIterator(dataset, 3, order_sampler=Balanced(0)),
         lambda: MultithreadIterator(dataset, 3, order_sampler=Balanced(0),
                                     n_threads=2),
         lambda: MultiprocessIterator(dataset, 3, order_sampler=Balanced(0),
                                      n_processes=2, start_method='fork')],
        9)


def test_oversampled_examples_have_their_own_example_rng(make):
    # Index 0 comes four times an epoch; each time at its own position, so
    # with its own augmentation, the same for every kind.
    dataset = AugmentedDataset(5)
    with make(dataset, 8, order_sampler=Balanced(3), seed=2) as it:
        got = [fingerprint(next(it)) for _ in range(3)]
    with SerialIterator(dataset, 8, order_sampler=Balanced(3), seed=2) as ref:
        assert got == [fingerprint(next(ref)) for _ in range(3)]
    with SerialIterator(dataset, 8, order_sampler=Balanced(3), seed=2) as ref:
        zeros = [x for i, x in next(ref) if i == 0]
    assert len(zeros) == 4
    assert len({x.tobytes() for x in zeros}) == 4


# ---- reset() draws a new order ---------------------------------------------

def test_per_epoch_idiom_reshuffles_every_pass(make):
    def passes():
        with make(list(range(8)), 3, repeat=False, seed=5) as it:
            out = []
            for _ in range(4):
                out.append(tuple(x for batch in it for x in batch))
                it.reset()
            return out
    got = passes()
    assert all(sorted(p) == list(range(8)) for p in got)
    assert len(set(got)) == 4           # a new order every pass
    assert passes() == got              # a pure function of the seed


def test_reset_count_is_in_the_snapshot(make):
    dataset = AugmentedDataset(7)
    with SerialIterator(dataset, 3, seed=9) as ref:
        for _ in range(3):
            next(ref)
            ref.reset()
        next(ref)
        state = ref.state_dict()
        assert state['reset_count'] == 3
        expected = [fingerprint(next(ref)) for _ in range(5)]
    with make(dataset, 3, seed=0) as it:
        it.load_state_dict(state)
        assert [fingerprint(next(it)) for _ in range(5)] == expected


def test_reset_with_an_order_sampler_asks_it_again(make):
    with make(list(range(6)), 6, order_sampler=Balanced(1)) as it:
        first = next(it)
        it.reset()
        assert next(it) != first


# ---- snapshots written by Chainer's serializers ---------------------------

class _ChainerSerializer:
    """Stands for ``chainer.serializer.Serializer``, which is how chainiter
    knows Chainer's serializers (so this runs without Chainer;
    test_chainer_differential.py loads the snapshots into Chainer's own
    iterators)."""


_ChainerSerializer.__module__ = 'chainer.serializer'
_ChainerSerializer.__name__ = _ChainerSerializer.__qualname__ = 'Serializer'


class ChainerDictionary(_ChainerSerializer):
    """Keeps each value under its key, as the serializer of Chainer's unit
    tests does (no children)."""

    def __init__(self):
        self.target = {}

    def __getitem__(self, key):
        raise NotImplementedError

    def __call__(self, key, value):
        self.target[key] = value
        return value


@pytest.mark.parametrize('kind, options', [
    (kind, options) for kind in KINDS
    # The key is chosen by the iterator's class alone: each start method
    # once.
    for options in (['seed', 'order_sampler', 'in order']
                    if kind in ('serial', 'thread') else ['seed'])])
def test_chainers_serializers_get_the_order_as_chainer_writes_it(
        kind, options):
    # Chainer's MultithreadIterator reads its order from '_order' (None
    # when unshuffled), the others from 'order'; chainiter's own snapshot
    # of a seeded shuffle holds the seed alone.  Either loads back into a
    # chainiter iterator, the seed kept.
    make = KINDS[kind]
    kwargs = {'seed': lambda: dict(seed=5),
              'order_sampler': lambda: dict(order_sampler=Balanced(2)),
              'in order': lambda: dict(shuffle=False)}[options]
    with make(AugmentedDataset(10), 3, **kwargs()) as it:
        for _ in range(4):
            next(it)                # past the end of epoch 0
        key = '_order' if isinstance(it, MultithreadIterator) else 'order'
        own = it.state_dict()
        chainers = ChainerDictionary()
        it.serialize(chainers)
        expected = [fingerprint(next(it)) for _ in range(8)]
    others = set(own) - {'order'}
    assert set(chainers.target) - {key} == others
    if options == 'seed':
        assert 'order' not in own
        assert numpy.array_equal(chainers.target[key],
                                 chainiter.iterators.order_samplers
                                 .seeded_order(5, 1, 10))
    elif options == 'order_sampler':
        assert numpy.array_equal(chainers.target[key], own['order'])
    elif key == '_order':
        assert chainers.target[key] is None
    else:
        assert key not in chainers.target
    with make(AugmentedDataset(10), 3, **dict(kwargs(), seed=77)) as other:
        other.serialize(chainiter.serializers.NpzDeserializer(
            {k: numpy.asarray(v) for k, v in chainers.target.items()}))
        assert [fingerprint(next(other)) for _ in range(8)] == expected


@pytest.mark.parametrize('kind', [SerialIterator, MultithreadIterator])
def test_a_prefetcher_writes_the_order_of_the_batch_handed_out(kind):
    with chainiter.DevicePrefetcher(kind(list(range(10)), 3, seed=5),
                                    depth=3) as it:
        for _ in range(3):
            next(it)     # position 9 of epoch 0; epoch 1 loaded ahead
        chainers = ChainerDictionary()
        it.serialize(chainers)
    key = '_order' if kind is MultithreadIterator else 'order'
    assert numpy.array_equal(
        chainers.target[key],
        chainiter.iterators.order_samplers.seeded_order(5, 0, 10))
    assert chainers.target['epoch'] == 0


# ---- numpy's global RNG ----------------------------------------------------

@pytest.mark.parametrize('options', ['in order', 'order_sampler'])
def test_without_a_shuffle_numpys_global_rng_is_left_alone(make, options):
    # As Chainer's iterators leave it: a model initialised after its
    # iterators are built gets the same weights as under Chainer.
    dataset, kwargs = {
        'in order': (AugmentedDataset(7), dict(shuffle=False)),
        'order_sampler': (AugmentedDataset(3),
                          dict(order_sampler=Oversample()))}[options]
    numpy.random.seed(0)
    name, keys, position, has_gauss, cached = numpy.random.get_state()
    with make(dataset, 2, **kwargs) as it:
        for _ in range(4):
            next(it)
        it.reset()
        next(it)
        chainiter.serializers.save_npz(io.BytesIO(), it)
    after = numpy.random.get_state()
    assert numpy.array_equal(after[1], keys)
    assert after[2:] == (position, has_gauss, cached)


def test_without_a_shuffle_numpy_random_seed_still_keys_example_rng():
    # The seed is read from the global RNG's state, not drawn from it (by
    # the constructor that every kind shares).
    def run(global_seed):
        numpy.random.seed(global_seed)
        with SerialIterator(AugmentedDataset(5), 2, shuffle=False) as it:
            return [fingerprint(next(it)) for _ in range(3)]

    assert run(1) == run(1) != run(2)


def test_a_shuffle_without_a_seed_draws_it_from_numpys_global_rng():
    def seed(global_seed):
        numpy.random.seed(global_seed)
        before = numpy.random.get_state()[2]
        with SerialIterator(list(range(5)), 2) as it:
            assert numpy.random.get_state()[2] != before    # drawn
            return it.seed

    assert seed(1) == seed(1) != seed(2)


# ---- examples arrive exactly as dataset[i] returned them ------------------

@pytest.mark.parametrize('kind', ['uniform', 'bare', 'irregular'])
def test_examples_keep_their_types(make, kind):
    # A 0-d array stays a 0-d array (not a numpy scalar), a numpy scalar a
    # scalar, through the pipe (first batch) and shared memory (the rest).
    dataset = helpers.ZeroDim(24, kind)
    with make(dataset, 4, shuffle=False) as it:
        got = [fingerprint(next(it)) for _ in range(6)]
    with SerialIterator(dataset, 4, shuffle=False) as ref:
        assert got == [fingerprint(next(ref)) for _ in range(6)]


# ---- copy.copy and pickle ---------------------------------------------------

def _copy(it):
    return copy.copy(it)


def _pickle(it):
    return pickle.loads(pickle.dumps(it))


@pytest.mark.parametrize('duplicate', [_copy, _pickle], ids=['copy', 'pickle'])
@pytest.mark.parametrize('steps', [0, 2, 5])
def test_copy_and_pickle_resume_where_the_original_is(make, duplicate, steps):
    dataset = AugmentedDataset(7)
    with make(dataset, 3, seed=4) as it:
        it.reset()      # a second pass: the reset count goes along
        for _ in range(steps):
            next(it)
        attrs = attributes(it)
        twin = duplicate(it)
        try:
            assert type(twin) is type(it)
            assert attributes(twin) == attrs
            # Independent: each goes on with the same stream.
            expected = [fingerprint(next(it)) for _ in range(4)]
            assert [fingerprint(next(twin)) for _ in range(4)] == expected
            assert attributes(twin) == attributes(it)
        finally:
            twin.finalize()


def test_copies_of_an_order_sampler_iterator_are_independent(make):
    with make(list(range(5)), 2, order_sampler=Balanced(2)) as it:
        next(it)
        twin = copy.copy(it)
        try:
            assert twin.order_sampler is not it.order_sampler
            a = [next(it) for _ in range(9)]
            assert [next(twin) for _ in range(9)] == a
        finally:
            twin.finalize()


def test_an_unpickled_multiprocess_iterator_has_its_own_workers():
    dataset = helpers.Pids()
    with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              start_method='fork') as it:
        first = {pid for _, pid, _, _ in next(it)}
        twin = _pickle(it)
        try:
            assert twin.n_processes == 2 and twin.start_method == 'fork'
            batch = next(twin)
            assert [i for i, _, _, _ in batch] == [4, 5, 6, 7]
            assert not {pid for _, pid, _, _ in batch} & first
        finally:
            twin.finalize()


def test_a_pickled_prefetcher_resumes_at_the_batch_handed_out():
    inner = SerialIterator(list(range(10)), 2, seed=1)
    with chainiter.DevicePrefetcher(inner, depth=3) as it:
        next(it)
        twin = _pickle(it)
        copied = copy.copy(it)
        expected = [next(it).tolist() for _ in range(6)]
        assert [next(twin).tolist() for _ in range(6)] == expected
        assert [next(copied).tolist() for _ in range(6)] == expected


def test_copying_does_not_call_the_order_sampler(make):
    # A sampler with state but no serialize (e.g. Chainer's own
    # ShuffleOrderSampler) is shared by a copy, as in Chainer: copying must
    # not draw from it.
    def orders(copies):
        with make(list(range(6)), 3,
                  order_sampler=helpers.CountingSampler(4)) as it:
            next(it)
            for _ in range(copies):
                copy.copy(it).finalize()
            return [next(it) for _ in range(5)]
    assert orders(2) == orders(0)


@pytest.mark.parametrize('duplicate', [_copy, _pickle], ids=['copy', 'pickle'])
def test_subclasses_and_their_attributes_survive_copies(duplicate):
    it = helpers.LabelledIterator(list(range(5)), labels=['a', 'b'])
    next(it)
    it.tag = 'train'
    twin = duplicate(it)
    assert type(twin) is helpers.LabelledIterator
    assert twin.labels == ['a', 'b'] and twin.tag == 'train'
    assert next(twin) == next(it) == [2, 3]


def test_a_multiprocess_iterator_passed_to_a_child_process(method):
    import multiprocessing
    ctx = multiprocessing.get_context(method)
    dataset = helpers.Examples(12, 'tuple')
    with MultiprocessIterator(dataset, 4, n_processes=2, seed=3,
                              start_method=method) as it:
        next(it)
        queue = ctx.Queue()
        child = ctx.Process(target=helpers.next_batches_in_child,
                            args=(it, 2, queue))
        child.start()
        try:
            got = queue.get(timeout=60)
        finally:
            child.join(60)
        assert child.exitcode == 0
        assert got == [fingerprint(next(it)) for _ in range(2)]


def test_finalize_in_a_forked_child_leaves_the_parents_workers(capfd):
    import atexit
    import os
    import warnings
    dataset = helpers.Examples(40, 'tuple')
    with MultiprocessIterator(dataset, 4, n_processes=2, seed=3,
                              start_method='fork') as it:
        next(it)
        with warnings.catch_warnings():
            # The user's fork: Python 3.12+ warns about the threads.
            warnings.simplefilter('ignore', DeprecationWarning)
            pid = os.fork()
        if pid == 0:        # the child: finalize, then exit as Python does
            code = 1
            try:
                it.finalize()
                atexit._run_exitfuncs()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        got = [fingerprint(next(it)) for _ in range(5)]
    with SerialIterator(dataset, 4, seed=3) as ref:
        next(ref)
        assert got == [fingerprint(next(ref)) for _ in range(5)]
    assert 'can only join a child process' not in capfd.readouterr().err


def test_prefetcher_takes_the_stopping_calls_attributes():
    inner = SerialIterator(list(range(5)), 2, repeat=False, shuffle=False)
    with chainiter.DevicePrefetcher(inner, depth=2) as it:
        assert len(list(it)) == 3
        assert it.previous_epoch_detail == 1.0 == it.epoch_detail
        assert it.state_dict()['previous_epoch_detail'] == 1.0
        assert _pickle(it).previous_epoch_detail == 1.0


@pytest.mark.parametrize('kind', ['namedtuple', 'ordereddict', 'matrix',
                                  'recarray', 'masked', 'big-endian'])
def test_large_examples_keep_their_types(make, kind):
    # Examples of 20 KB go through shared memory: containers other than
    # plain tuples and dicts, and ndarray subclasses, arrive as they were.
    dataset = helpers.Typed(12, kind)
    with make(dataset, 4, shuffle=False) as it:
        got = [helpers.describe(next(it)) for _ in range(3)]
    with SerialIterator(dataset, 4, shuffle=False) as ref:
        assert got == [helpers.describe(next(ref)) for _ in range(3)]


def test_stacked_fields_of_the_other_byte_order(method):
    # The workers stack them as concat_examples does (native order), with
    # no warning (an error here) and nothing taken for oversize.
    dataset = helpers.ByteOrders()
    with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              converter=chainiter.concat_examples,
                              start_method=method) as it:
        got = [helpers.describe(next(it)) for _ in range(4)]
    with SerialIterator(dataset, 4, shuffle=False) as ref:
        assert got == [helpers.describe(chainiter.concat_examples(next(ref)))
                       for _ in range(4)]
