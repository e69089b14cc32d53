from chainiter.datasets.tuple_dataset import _is_batch_index, _length


class DictDataset:
    """Dict version of ``TupleDataset``: example ``i`` is
    ``{name: d[i] for name, d in datasets.items()}``."""

    def __init__(self, **datasets):
        if not datasets:
            raise ValueError('DictDataset needs at least one dataset')
        lengths = {key: _length(d, 'dataset {!r}'.format(key))
                   for key, d in datasets.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(
                'DictDataset needs datasets of equal length, got lengths '
                '{}'.format(lengths))
        self._datasets = datasets
        self._length = next(iter(lengths.values()))

    def __getitem__(self, index):
        fields = {key: dataset[index]
                  for key, dataset in self._datasets.items()}
        if _is_batch_index(index):
            length = len(next(iter(fields.values())))
            return [{key: value[i] for key, value in fields.items()}
                    for i in range(length)]
        return fields

    def __len__(self):
        return self._length
