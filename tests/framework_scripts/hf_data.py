"""A HuggingFace ``datasets.Dataset`` that answers only batched access
(``__getitems__``, a list of indices): ``dataset[i]`` raises, so a test
over it shows that the iterators ask for whole chunks (module level:
workers started by spawn or forkserver import it)."""

import datasets
import numpy


class OnlyBatches(datasets.Dataset):

    def __getitem__(self, key):
        if isinstance(key, (int, numpy.integer)):
            raise AssertionError('dataset[{}] was asked for one by one'
                                 .format(key))
        return super().__getitem__(key)


def columns(n=20):
    return {'x': numpy.arange(n * 3, dtype=numpy.float32).reshape(n, 3),
            'label': numpy.arange(n) % 4}


def make(fmt, only_batches):
    dataset = datasets.Dataset.from_dict(columns())
    if only_batches:
        dataset = OnlyBatches(dataset.data, info=dataset.info)
    return dataset.with_format(fmt)
