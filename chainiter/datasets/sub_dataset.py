import numpy

from chainiter.dataset.dataset_mixin import DatasetMixin


class SubDataset(DatasetMixin):
    """The examples ``start <= j < finish`` of ``dataset``, optionally
    through a permutation: example ``j`` is ``dataset[order[start + j]]``."""

    def __init__(self, dataset, start, finish, order=None):
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

    def __len__(self):
        return self._size

    def get_example(self, i):
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


def split_dataset(dataset, split_at, order=None):
    """Split into ``dataset[:split_at]`` and ``dataset[split_at:]`` (through
    ``order`` if given), as two ``SubDataset``s."""
    n = len(dataset)
    if not isinstance(split_at, (int, numpy.integer)):
        raise TypeError('split_at must be an int, got {!r}'.format(split_at))
    if split_at < 0 or split_at > n:
        raise ValueError('split_at {} is outside [0, {}]'.format(split_at, n))
    return (SubDataset(dataset, 0, split_at, order),
            SubDataset(dataset, split_at, n, order))


def split_dataset_random(dataset, first_size, seed=None):
    """Split into two ``SubDataset``s of ``first_size`` and the rest,
    through a random permutation (``numpy.random.RandomState(seed)``)."""
    order = numpy.random.RandomState(seed).permutation(len(dataset))
    return split_dataset(dataset, first_size, order)
