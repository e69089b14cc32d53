import numpy
import pytest

from chainiter.datasets import (
    ConcatenatedDataset,
    DictDataset,
    SubDataset,
    TransformDataset,
    TupleDataset,
    get_cross_validation_datasets,
    get_cross_validation_datasets_random,
    split_dataset,
    split_dataset_n,
    split_dataset_n_random,
    split_dataset_random,
)


def test_tuple_dataset():
    d = TupleDataset(numpy.arange(4), numpy.arange(4) * 10)
    assert len(d) == 4
    assert d[1] == (1, 10)
    assert d[-1] == (3, 30)
    assert d[1:3] == [(1, 10), (2, 20)]
    assert d[numpy.array([0, 2])] == [(0, 0), (2, 20)]


def test_tuple_dataset_length_mismatch():
    with pytest.raises(ValueError, match='equal length.*\\[3, 2\\]'):
        TupleDataset([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match='at least one'):
        TupleDataset()


def test_dict_dataset():
    d = DictDataset(x=numpy.arange(3), y=[5, 6, 7])
    assert d[0] == {'x': 0, 'y': 5}
    assert d[-1] == {'x': 2, 'y': 7}
    assert d[:2] == [{'x': 0, 'y': 5}, {'x': 1, 'y': 6}]
    with pytest.raises(ValueError, match='equal length'):
        DictDataset(x=[1], y=[1, 2])


def test_sub_dataset_range_order_and_negative():
    base = list(range(10))
    sub = SubDataset(base, 2, 5)
    assert len(sub) == 3 and sub[0] == 2 and sub[-1] == 4
    assert sub[0:3] == [2, 3, 4]
    with pytest.raises(IndexError):
        sub[3]
    with pytest.raises(IndexError):
        sub[-4]
    order = list(reversed(range(10)))
    assert SubDataset(base, 0, 2, order)[:] == [9, 8]
    with pytest.raises(ValueError, match='does not fit'):
        SubDataset(base, 5, 11)
    with pytest.raises(ValueError, match='order has length'):
        SubDataset(base, 0, 2, [0, 1])


def test_split_dataset():
    a, b = split_dataset(list(range(5)), 2)
    assert a[:] == [0, 1] and b[:] == [2, 3, 4]
    with pytest.raises(ValueError, match='outside'):
        split_dataset(list(range(5)), 6)
    with pytest.raises(TypeError, match='int'):
        split_dataset(list(range(5)), 2.5)


def test_split_dataset_random_is_a_partition_and_seeded():
    a, b = split_dataset_random(list(range(20)), 7, seed=0)
    assert len(a) == 7 and len(b) == 13
    assert sorted(a[:] + b[:]) == list(range(20))
    c, _ = split_dataset_random(list(range(20)), 7, seed=0)
    assert a[:] == c[:]


def test_transform_dataset():
    d = TransformDataset([1, 2, 3], lambda x: x * 2)
    assert len(d) == 3 and d[0] == 2 and d[-1] == 6 and d[:2] == [2, 4]


def test_concatenated_dataset():
    d = ConcatenatedDataset([0, 1], [], [2, 3, 4])
    assert len(d) == 5
    assert [d[i] for i in range(5)] == [0, 1, 2, 3, 4]
    assert d[-1] == 4 and d[1:4] == [1, 2, 3]
    with pytest.raises(IndexError):
        d[5]


def test_split_dataset_n():
    parts = split_dataset_n(list(range(11)), 3)
    assert [list(p) for p in parts] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    order = list(range(10, -1, -1))
    parts = split_dataset_n(list(range(11)), 2, order)
    assert [list(p) for p in parts] == [[10, 9, 8, 7, 6], [5, 4, 3, 2, 1]]
    with pytest.raises(ValueError, match='n must be a positive int'):
        split_dataset_n([1], 0)


def test_split_dataset_n_random():
    parts = split_dataset_n_random(list(range(10)), 3, seed=4)
    again = split_dataset_n_random(list(range(10)), 3, seed=4)
    assert [list(p) for p in parts] == [list(p) for p in again]
    seen = [x for p in parts for x in p]
    assert len(seen) == 9 and len(set(seen)) == 9
    order = numpy.random.RandomState(4).permutation(10)
    assert list(parts[1]) == order[3:6].tolist()


@pytest.mark.parametrize('n, n_folds', [(10, 3), (7, 7), (5, 2), (3, 1)])
def test_cross_validation_folds_cover_the_dataset(n, n_folds):
    splits = get_cross_validation_datasets(list(range(n)), n_folds)
    assert len(splits) == n_folds
    tests = [list(test) for _, test in splits]
    assert sorted(x for t in tests for x in t) == list(range(n))
    assert max(map(len, tests)) - min(map(len, tests)) <= 1
    for train, test in splits:
        assert sorted(list(train) + list(test)) == list(range(n))


def test_cross_validation_as_chainer_orders_it():
    # Chainer 7.8.1's result for range(5), 2 folds, order 4..0.
    splits = get_cross_validation_datasets(list(range(5)), 2,
                                           order=[4, 3, 2, 1, 0])
    assert [(list(a), list(b)) for a, b in splits] == [
        ([4, 3], [2, 1, 0]), ([2, 1, 0], [4, 3])]


def test_cross_validation_random_and_deprecated_n_fold():
    a = get_cross_validation_datasets_random(list(range(9)), 3, seed=1)
    with pytest.warns(DeprecationWarning, match='n_folds'):
        b = get_cross_validation_datasets_random(list(range(9)), n_fold=3,
                                                 seed=1)
    assert [list(t) for _, t in a] == [list(t) for _, t in b]
    with pytest.raises(TypeError, match='n_foldz'):
        get_cross_validation_datasets(list(range(9)), n_foldz=3)


def test_more_folds_than_examples_is_an_error():
    # Chainer fails too (a broadcasting error); no empty test parts.
    with pytest.raises(ValueError, match='n_folds'):
        get_cross_validation_datasets(list(range(3)), 4)
