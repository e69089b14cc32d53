from typing import Any, Callable, Optional

from chainiter.datasets import _columns
from chainiter.datasets.tuple_dataset import is_batch_index, checked_length


class DictDataset:
    """Dict version of ``TupleDataset``: example ``i`` is
    ``{name: d[i] for name, d in datasets.items()}``.  Over numpy arrays,
    lists and tuples it has the batch method ``get_examples(indices)``, as
    ``TupleDataset`` has."""

    def __init__(self, **datasets: Any) -> None:
        if not datasets:
            raise ValueError('DictDataset needs at least one dataset')
        lengths = {key: checked_length(d, 'dataset {!r}'.format(key))
                   for key, d in datasets.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(
                'DictDataset needs datasets of equal length, got lengths '
                '{}'.format(lengths))
        self._datasets = datasets
        self._length = next(iter(lengths.values()))
        self._batchable = _columns.batchable(datasets.values())

    def __getitem__(self, index: Any) -> Any:
        fields = {key: dataset[index]
                  for key, dataset in self._datasets.items()}
        if is_batch_index(index):
            length = len(next(iter(fields.values())))
            return [{key: value[i] for key, value in fields.items()}
                    for i in range(length)]
        return fields

    def __len__(self) -> int:
        return self._length

    @property
    def get_examples(self) -> Optional[Callable[[Any], Any]]:
        """``get_examples(indices)``: a sequence of ``dataset[i]`` for each
        index; None when a dataset is not an array, list or tuple."""
        return self._get_examples if self._batchable else None

    def _get_examples(self, indices):
        return _columns.Columns('dict', self._datasets.keys(),
                                self._datasets.values(), indices,
                                self._length)
