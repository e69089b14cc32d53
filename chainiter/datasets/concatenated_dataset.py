from typing import Any

from chainiter.dataset.dataset_mixin import DatasetMixin


class ConcatenatedDataset(DatasetMixin):
    """The examples of several datasets one after another."""

    def __init__(self, *datasets: Any) -> None:
        self._datasets = datasets
        self._length = sum(len(d) for d in datasets)

    def __len__(self) -> int:
        return self._length

    def get_example(self, i: int) -> Any:
        if i < 0:
            i += self._length
        if not 0 <= i < self._length:
            raise IndexError(
                'index out of range for a ConcatenatedDataset of length '
                '{}'.format(self._length))
        for dataset in self._datasets:
            if i < len(dataset):
                return dataset[i]
            i -= len(dataset)
        raise AssertionError('unreachable')
