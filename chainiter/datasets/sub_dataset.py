import warnings
from typing import Any, Callable, List, Optional, Tuple

import numpy

from chainiter import _context
from chainiter.dataset.dataset_mixin import DatasetMixin


class SubDataset(DatasetMixin):
    """The examples ``start <= j < finish`` of ``dataset``, optionally
    through a permutation: example ``j`` is ``dataset[order[start + j]]``."""

    def __init__(self, dataset: Any, start: int, finish: int,
                 order: Optional[Any] = None) -> None:
        if start < 0 or finish > len(dataset) or start > finish:
            raise ValueError(
                'SubDataset range [{}, {}) does not fit a dataset of length '
                '{}'.format(start, finish, len(dataset)))
        if order is not None and len(order) != len(dataset):
            raise ValueError(
                'order has length {} but the dataset has length {}'.format(
                    len(order), len(dataset)))
        self._dataset = dataset
        self._start = start
        self._finish = finish
        self._size = finish - start
        self._order = order

    def __len__(self) -> int:
        return self._size

    def get_example(self, i: int) -> Any:
        if i >= 0:
            if i >= self._size:
                raise IndexError(
                    'index {} out of range for a SubDataset of length '
                    '{}'.format(i, self._size))
            index = self._start + i
        else:
            if i < -self._size:
                raise IndexError(
                    'index {} out of range for a SubDataset of length '
                    '{}'.format(i, self._size))
            index = self._finish + i
        if self._order is not None:
            index = self._order[index]
        return self._dataset[index]

    @property
    def get_examples(self) -> Optional[Callable[[Any], Any]]:
        """The batch method of the dataset underneath (``get_examples`` or
        ``__getitems__``), through this one's positions; None when it has
        none (so a ``split_dataset_random`` of a ``TupleDataset`` of arrays
        is loaded a chunk at a time, as the whole one is)."""
        if _context.batch_method(self._dataset) is None:
            return None
        return self._get_examples

    def _get_examples(self, indices):
        positions = numpy.asarray(indices)
        if positions.ndim != 1 or positions.size and \
                positions.dtype.kind not in 'iu':
            raise TypeError('get_examples takes a sequence of int indices, '
                            'got {!r}'.format(indices))
        positions = positions.astype(numpy.int64)
        outside = (positions < -self._size) | (positions >= self._size)
        if outside.any():
            raise IndexError(
                'index {} out of range for a SubDataset of length '
                '{}'.format(positions[outside][0], self._size))
        positions += numpy.where(positions < 0, self._finish, self._start)
        if self._order is not None:
            positions = numpy.asarray(self._order)[positions]
        return _context.batch_method(self._dataset)(positions.tolist())


def split_dataset(dataset: Any, split_at: int, order: Optional[Any] = None
                  ) -> Tuple[SubDataset, SubDataset]:
    """Split into ``dataset[:split_at]`` and ``dataset[split_at:]`` (through
    ``order`` if given), as two ``SubDataset`` objects."""
    n = len(dataset)
    if not isinstance(split_at, (int, numpy.integer)):
        raise TypeError('split_at must be an int, got {!r}'.format(split_at))
    if split_at < 0 or split_at > n:
        raise ValueError('split_at {} is outside [0, {}]'.format(split_at, n))
    return (SubDataset(dataset, 0, split_at, order),
            SubDataset(dataset, split_at, n, order))


def split_dataset_random(dataset: Any, first_size: int,
                         seed: Optional[int] = None
                         ) -> Tuple[SubDataset, SubDataset]:
    """Split into two ``SubDataset`` objects of ``first_size`` and the rest,
    through a random permutation (``numpy.random.RandomState(seed)``)."""
    order = numpy.random.RandomState(seed).permutation(len(dataset))
    return split_dataset(dataset, first_size, order)


def _check_parts(n, what):
    if isinstance(n, (bool, numpy.bool_)) or not isinstance(
            n, (int, numpy.integer)) or n <= 0:
        raise ValueError('{} must be a positive int, got {!r}'.format(
            what, n))
    return int(n)


def split_dataset_n(dataset: Any, n: int, order: Optional[Any] = None
                    ) -> List[SubDataset]:
    """Split into ``n`` ``SubDataset`` objects of ``len(dataset) // n``
    examples each: part ``i`` holds positions
    ``i * size ... (i + 1) * size - 1`` (through ``order`` if given).  As
    in Chainer, the last ``len(dataset) % n`` examples belong to no part."""
    n = _check_parts(n, 'n')
    size = len(dataset) // n
    return [SubDataset(dataset, i * size, (i + 1) * size, order)
            for i in range(n)]


def split_dataset_n_random(dataset: Any, n: int, seed: Optional[int] = None
                           ) -> List[SubDataset]:
    """``split_dataset_n`` through a random permutation
    (``numpy.random.RandomState(seed)``, as Chainer draws it)."""
    order = numpy.random.RandomState(seed).permutation(len(dataset))
    return split_dataset_n(dataset, n, order)


def _n_folds(n_folds, kwargs):
    if 'n_fold' in kwargs:   # Chainer's deprecated spelling
        warnings.warn('n_fold is deprecated; pass n_folds',
                      DeprecationWarning, stacklevel=3)
        n_folds = kwargs.pop('n_fold')
    if kwargs:
        raise TypeError('unexpected keyword arguments: {}'.format(
            ', '.join(sorted(kwargs))))
    return _check_parts(n_folds, 'n_folds')


def get_cross_validation_datasets(
        dataset: Any, n_folds: Optional[int] = None,
        order: Optional[Any] = None, **kwargs: Any
) -> List[Tuple[SubDataset, SubDataset]]:
    """``n_folds`` (train, test) pairs of ``SubDataset`` objects for cross
    validation, as Chainer makes them: the test parts are disjoint, cover
    the dataset and differ in length by at most one; each train part is
    the rest.  ``order`` permutes the indices first."""
    n_folds = _n_folds(n_folds, kwargs)
    n = len(dataset)
    if n_folds > n:
        raise ValueError(
            'n_folds ({}) is larger than the dataset ({} examples): some '
            'test parts would be empty'.format(n_folds, n))
    order = numpy.arange(n) if order is None else numpy.array(order)
    test_sizes = [n * (i + 1) // n_folds - n * i // n_folds
                  for i in range(n_folds)]
    splits = []
    for test_size in reversed(test_sizes):
        splits.append(split_dataset(dataset, n - test_size, order))
        # Rotate so that the next test part is at the end.
        order = numpy.roll(order, test_size)
    return splits


def get_cross_validation_datasets_random(
        dataset: Any, n_folds: Optional[int] = None,
        seed: Optional[int] = None, **kwargs: Any
) -> List[Tuple[SubDataset, SubDataset]]:
    """``get_cross_validation_datasets`` through a random permutation
    (``numpy.random.RandomState(seed)``)."""
    n_folds = _n_folds(n_folds, kwargs)
    order = numpy.random.RandomState(seed).permutation(len(dataset))
    return get_cross_validation_datasets(dataset, n_folds, order)
