from typing import Any, Callable, Optional

import numpy

from chainiter.datasets import _columns


def checked_length(dataset, name):
    try:
        return len(dataset)
    except TypeError:
        raise TypeError('{} has no length (type {}); pass arrays or '
                        'sequences'.format(name, type(dataset).__name__)
                        ) from None


def is_batch_index(index):
    return isinstance(index, (slice, list, numpy.ndarray))


class TupleDataset:
    """Zips datasets of equal length: example ``i`` is
    ``(d0[i], d1[i], ...)``.  Slices and index arrays give lists of tuples.

    Over numpy arrays, lists and tuples it has a batch method,
    ``get_examples(indices)``: the examples ``dataset[i]`` for each index,
    taken a column at a time (the iterators call it once per chunk);
    over anything else ``get_examples`` is None and the iterators load
    ``dataset[i]`` one by one (so ``example_rng()`` there works)."""

    def __init__(self, *datasets: Any) -> None:
        if not datasets:
            raise ValueError('TupleDataset needs at least one dataset')
        lengths = [checked_length(d, 'dataset {}'.format(i))
                   for i, d in enumerate(datasets)]
        if len(set(lengths)) != 1:
            raise ValueError(
                'TupleDataset needs datasets of equal length, got lengths '
                '{}'.format(lengths))
        self._datasets = datasets
        self._length = lengths[0]
        self._batchable = _columns.batchable(datasets)

    def __getitem__(self, index: Any) -> Any:
        fields = [dataset[index] for dataset in self._datasets]
        if is_batch_index(index):
            return list(zip(*fields))
        return tuple(fields)

    def __len__(self) -> int:
        return self._length

    @property
    def get_examples(self) -> Optional[Callable[[Any], Any]]:
        """``get_examples(indices)``: a sequence of ``dataset[i]`` for each
        index; None when a dataset is not an array, list or tuple."""
        return self._get_examples if self._batchable else None

    def _get_examples(self, indices):
        return _columns.Columns('tuple', range(len(self._datasets)),
                                self._datasets, indices, self._length)
