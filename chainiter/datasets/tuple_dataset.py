import numpy


def _length(dataset, name):
    try:
        return len(dataset)
    except TypeError:
        raise TypeError('{} has no length (type {}); pass arrays or '
                        'sequences'.format(name, type(dataset).__name__)
                        ) from None


def _is_batch_index(index):
    return isinstance(index, (slice, list, numpy.ndarray))


class TupleDataset:
    """Zips datasets of equal length: example ``i`` is
    ``(d0[i], d1[i], ...)``.  Slices and index arrays give lists of tuples."""

    def __init__(self, *datasets):
        if not datasets:
            raise ValueError('TupleDataset needs at least one dataset')
        lengths = [_length(d, 'dataset {}'.format(i))
                   for i, d in enumerate(datasets)]
        if len(set(lengths)) != 1:
            raise ValueError(
                'TupleDataset needs datasets of equal length, got lengths '
                '{}'.format(lengths))
        self._datasets = datasets
        self._length = lengths[0]

    def __getitem__(self, index):
        fields = [dataset[index] for dataset in self._datasets]
        if _is_batch_index(index):
            return list(zip(*fields))
        return tuple(fields)

    def __len__(self):
        return self._length
