"""Chainer's iterator behaviours, for every in-process iterator kind."""

import threading

import numpy
import pytest

import chainiter
from chainiter import MultithreadIterator, SerialIterator

def drain_epoch(it):
    seen = []
    while True:
        seen.extend(next(it))
        if it.is_new_epoch:
            return seen


def test_no_shuffle_in_order_with_epoch_attributes(make):
    with make(list(range(6)), 2, shuffle=False) as it:
        assert it.epoch == 0 and it.current_position == 0
        assert it.epoch_detail == 0 and it.previous_epoch_detail is None
        assert it.batch_size == 2 and it.repeat and it.epoch_size == 6
        assert next(it) == [0, 1]
        assert (it.epoch, it.current_position, it.is_new_epoch) == (0, 2, False)
        assert it.previous_epoch_detail == 0
        assert it.epoch_detail == pytest.approx(2 / 6)
        assert next(it) == [2, 3]
        assert next(it) == [4, 5]
        assert (it.epoch, it.current_position, it.is_new_epoch) == (1, 0, True)
        assert it.previous_epoch_detail == pytest.approx(4 / 6)
        assert next(it) == [0, 1]
        assert it.is_new_epoch is False


def test_wrap_around_batch_is_new_epoch(make):
    with make(list(range(5)), 3, shuffle=False) as it:
        assert next(it) == [0, 1, 2]
        assert next(it) == [3, 4, 0]
        assert it.is_new_epoch and it.epoch == 1 and it.current_position == 1
        assert it.epoch_detail == pytest.approx(1.2)


def test_no_repeat_short_last_batch_then_stop_iteration(make):
    with make(list(range(5)), 2, repeat=False, shuffle=False) as it:
        assert list(it) == [[0, 1], [2, 3], [4]]
        assert it.epoch == 1 and it.is_new_epoch
        with pytest.raises(StopIteration):
            next(it)


def test_no_repeat_empty_dataset_gives_nothing(make):
    with make([], 2, repeat=False) as it:
        assert list(it) == []


def test_shuffle_every_epoch_is_a_permutation_and_differs(make):
    with make(list(range(20)), 4, seed=3) as it:
        first = drain_epoch(it)
        second = drain_epoch(it)
    assert sorted(first) == sorted(second) == list(range(20))
    assert first != second


def test_same_seed_same_orders_across_kinds(make):
    with SerialIterator(list(range(17)), 5, seed=11) as ref, \
            make(list(range(17)), 5, seed=11) as it:
        for _ in range(10):
            assert next(it) == next(ref)


def test_seed_none_follows_numpy_global_seed(make):
    numpy.random.seed(5)
    with make(list(range(30)), 7) as a:
        batches_a = [next(a) for _ in range(8)]
    numpy.random.seed(5)
    with make(list(range(30)), 7) as b:
        batches_b = [next(b) for _ in range(8)]
    assert batches_a == batches_b


def test_order_sampler_protocol(make):
    calls = []

    def sampler(order, position):
        calls.append((list(order), position))
        return numpy.asarray(order)[::-1]

    with make(list(range(4)), 3, order_sampler=sampler) as it:
        assert calls == [([0, 1, 2, 3], 0)]
        assert next(it) == [3, 2, 1]
        assert next(it) == [0, 0, 1]
        assert calls[1] == ([3, 2, 1, 0], 3)


def test_shuffle_order_sampler_is_repeatable(make):
    def run():
        sampler = chainiter.ShuffleOrderSampler(numpy.random.RandomState(4))
        with make(list(range(10)), 3, order_sampler=sampler) as it:
            return [next(it) for _ in range(9)]
    assert run() == run()
    assert sorted(sum(run()[:4], [])[:10]) == list(range(10))


def test_reset_at_any_time_starts_a_new_pass_with_a_new_order(make):
    def run():
        with make(list(range(7)), 3, seed=2) as it:
            first = [next(it) for _ in range(4)]
            it.reset()
            assert (it.epoch, it.current_position, it.is_new_epoch) == (
                0, 0, False)
            assert it.previous_epoch_detail is None
            return first, [next(it) for _ in range(4)]
    first, second = run()
    assert first != second                  # Chainer draws a new order
    assert sorted(sum(second[:2], []) + second[2][:1]) == list(range(7))
    assert run() == (first, second)         # and the seed still decides it


def test_reset_after_stop_iteration(make):
    with make(list(range(3)), 2, repeat=False, shuffle=False) as it:
        assert list(it) == [[0, 1], [2]]
        it.reset()
        assert list(it) == [[0, 1], [2]]


def test_finalize_is_idempotent_and_next_after_it_fails(make):
    it = make(list(range(4)), 2)
    next(it)
    it.finalize()
    it.finalize()
    with pytest.raises(chainiter.IteratorFinalizedError, match='finalize'):
        next(it)
    with pytest.raises(RuntimeError):
        it.reset()


def test_with_block_finalizes(make):
    with make(list(range(4)), 2) as it:
        next(it)
    with pytest.raises(chainiter.IteratorFinalizedError):
        next(it)


class Failing:
    def __init__(self, bad):
        self.bad = bad

    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == self.bad:
            raise KeyError('broken example {}'.format(i))
        return i


def test_dataset_error_does_not_advance_and_retries(make):
    dataset = Failing(bad=3)
    with make(dataset, 2, shuffle=False) as it:
        assert next(it) == [0, 1]
        with pytest.raises(KeyError, match='broken example 3'):
            next(it)
        assert it.current_position == 2 and it.epoch == 0
        dataset.bad = None
        assert next(it) == [2, 3]
        assert next(it) == [4, 5]


def test_example_rng_is_per_example_and_repeatable(make):
    dataset = _rng_dataset()
    with make(dataset, 4, shuffle=False, seed=9) as a, \
            SerialIterator(dataset, 4, shuffle=False, seed=9) as b:
        batches = [next(a) for _ in range(5)]
        assert batches == [next(b) for _ in range(5)]
    values = [v for batch in batches for _, v in batch]
    assert len(set(values)) == len(values)   # epochs differ too


class _rng_dataset:
    def __len__(self):
        return 6

    def __getitem__(self, i):
        rng = chainiter.example_rng()
        return i, (float(rng.random()), float(rng.random()))


def test_example_rng_outside_an_iterator_is_an_error():
    with pytest.raises(RuntimeError, match='outside'):
        chainiter.example_rng()


class _Info:
    def __len__(self):
        return 2

    def __getitem__(self, i):
        return chainiter.get_worker_info()


def test_get_worker_info_is_none_in_main_process():
    assert chainiter.get_worker_info() is None
    with SerialIterator(_Info(), 2) as it:
        assert next(it) == [None, None]


@pytest.mark.parametrize('n_threads', [1, 3])
def test_get_worker_info_describes_the_worker_thread(n_threads):
    seen = []

    def init(worker_id):
        seen.append((worker_id, chainiter.get_worker_info()))

    with MultithreadIterator(_Info(), 2, n_threads=n_threads, seed=7,
                             worker_init_fn=init) as it:
        infos = next(it)
        assert chainiter.get_worker_info() is None     # the caller's
    assert all(type(info).__name__ == "WorkerInfo" for info in infos)
    assert all(info.num_workers == n_threads for info in infos)
    assert sorted(w for w, _ in seen) == list(range(n_threads))
    for worker_id, info in seen:
        wid, n, seed = info
        assert (wid, n, seed) == (worker_id, n_threads, 7 + worker_id)
        assert info.incarnation == 0


def test_multithread_loads_ahead_while_the_user_holds_a_batch():
    started = threading.Event()

    class Probe:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i >= 2:
                started.set()
            return i

    with MultithreadIterator(Probe(), 2, shuffle=False) as it:
        assert next(it) == [0, 1]
        assert started.wait(timeout=10), 'the next batch was not prefetched'
        assert it.current_position == 2


@pytest.mark.parametrize('batch_size', [0, -1, 1.5, '2', True, None])
def test_bad_batch_size(make, batch_size):
    with pytest.raises(ValueError, match='batch_size must be a positive int'):
        make(list(range(3)), batch_size)


def test_shuffle_and_order_sampler_together(make):
    with pytest.raises(ValueError, match='either shuffle or order_sampler'):
        make(list(range(3)), 1, shuffle=True,
             order_sampler=chainiter.ShuffleOrderSampler())


def test_empty_dataset_with_repeat(make):
    with pytest.raises(ValueError, match='empty.*repeat=False'):
        make([], 1)


def test_not_a_dataset(make):
    with pytest.raises(TypeError, match='__len__ and __getitem__'):
        make(iter([1, 2]), 1)


class _Indexer:
    def __init__(self, values):
        self.values = values

    def __getitem__(self, i):
        return self.values[i]


class _RangeIndex:
    def __init__(self, start, n):
        self.start, self.stop, self.step = start, start + n, 1


_RangeIndex.__name__ = 'RangeIndex'
_RangeIndex.__module__ = 'pandas.core.indexes.range'


class _DataFrame:
    """Stands in for pandas.DataFrame (pandas need not be installed):
    ``[key]`` is a column, ``.iloc[i]`` a row."""

    def __init__(self, n):
        self.columns = ['x', 'y']
        self.iloc = _Indexer([(i, -i) for i in range(n)])
        self.index = _RangeIndex(0, n)

    def __len__(self):
        return len(self.iloc.values)

    def __getitem__(self, column):
        return [row[self.columns.index(column)] for row in self.iloc.values]


_DataFrame.__name__ = 'DataFrame'
_DataFrame.__module__ = 'pandas.core.frame'


class _Series:
    """Stands in for pandas.Series: ``[key]`` is by label."""

    def __init__(self, values, index):
        self.iloc = _Indexer(values)
        self.index = index

    def __len__(self):
        return len(self.iloc.values)

    def __getitem__(self, label):
        return self.iloc.values[label - self.index.start]


_Series.__name__ = 'Series'
_Series.__module__ = 'pandas.core.series'


class _MyFrame(_DataFrame):    # a user's subclass, as geopandas has
    pass


def _assert_names_the_fix(error):
    message = str(error.value)
    for fix in ('.iloc', 'chainiter.datasets.TupleDataset(df[col].to_numpy()',
                'df.to_numpy()'):
        assert fix in message, message


@pytest.mark.parametrize('dataset', [
    _DataFrame(4), _MyFrame(4), _Series([1, 2, 3], _RangeIndex(10, 3))],
    ids=['DataFrame', 'subclass', 'Series-labelled-from-10'])
def test_pandas_by_label_is_refused(make, dataset):
    with pytest.raises(TypeError, match='pandas') as error:
        make(dataset, 2)
    _assert_names_the_fix(error)


def test_pandas_refused_before_workers_start(method):
    with pytest.raises(TypeError, match='pandas DataFrame') as error:
        chainiter.MultiprocessIterator(_DataFrame(4), 2, n_processes=1,
                                       start_method=method)
    _assert_names_the_fix(error)


def test_series_labelled_by_position_is_a_dataset(make):
    with make(_Series([5, 6, 7], _RangeIndex(0, 3)), 3,
              shuffle=False) as it:
        assert next(it) == [5, 6, 7]


def test_real_pandas():
    pandas = pytest.importorskip('pandas')
    frame = pandas.DataFrame({'x': [1, 2, 3], 'y': [4, 5, 6]})
    with pytest.raises(TypeError, match='pandas DataFrame') as error:
        SerialIterator(frame, 2)
    _assert_names_the_fix(error)
    with pytest.raises(TypeError, match='pandas Series whose index'):
        SerialIterator(pandas.Series([1, 2, 3], index=[7, 8, 9]), 2)
    with SerialIterator(frame['x'], 3, shuffle=False) as it:
        assert [int(x) for x in next(it)] == [1, 2, 3]


@pytest.mark.parametrize('order', [[0, 1, 2, 5], [0, 1, -1], [[0, 1, 2]]],
                         ids=['too-large', 'negative', '2-d'])
def test_sampler_with_bad_order(make, order):
    with pytest.raises(ValueError, match='order sampler'):
        make(list(range(3)), 1, order_sampler=lambda o, p: numpy.array(order))


def test_sampler_turning_bad_at_epoch_end(make):
    calls = []

    def sampler(order, position):
        calls.append(1)
        return numpy.arange(3) if len(calls) == 1 else numpy.arange(2)

    with make(list(range(3)), 2, order_sampler=sampler) as it:
        next(it)
        with pytest.raises(ValueError, match='order sampler'):
            next(it)


@pytest.mark.parametrize('bad', [[0, 1], [0, 1, 2, 3], [0, 1, 3], [-1, 0, 1]],
                         ids=['short', 'long', 'too-large', 'negative'])
def test_sampler_bad_at_an_epoch_boundary(make, bad):
    orders = [numpy.arange(3), numpy.array(bad)]

    def sampler(order, position):
        return orders.pop(0)

    with make(list(range(3)), 3, order_sampler=sampler) as it:
        with pytest.raises(ValueError, match='order sampler'):
            next(it)     # the batch that ends the epoch asks for the next


def test_multithread_bad_n_threads():
    with pytest.raises(ValueError, match='n_threads'):
        MultithreadIterator([1], 1, n_threads=0)


def test_bad_seed(make):
    with pytest.raises(ValueError, match='seed'):
        make([1, 2], 1, seed=-3)
