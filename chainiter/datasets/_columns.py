"""The examples of ``TupleDataset.get_examples`` and
``DictDataset.get_examples``, held as columns.

``Columns`` is a sequence of examples equal, one by one, to
``dataset[i]`` for each index.  It keeps the datasets and the indices
rather than building a tuple (or dict) per example: a worker that stacks
the batch takes each array field straight into the rows of its slot
(``numpy.take(..., out=rows)``, see ``stacked_columns.py`` of the
multiprocess iterator), and only a reader that wants the examples one by
one (a list of examples, another converter) gets them built, from one
fancy-indexed copy per field.
"""

import collections.abc

import numpy


def batchable(datasets):
    """Whether ``get_examples`` may index these datasets a column at a
    time: numpy arrays, lists and tuples, whose items depend on the index
    alone.  Any other dataset may draw from ``example_rng()``, which is
    keyed per example: it is indexed example by example."""
    return all(isinstance(d, (numpy.ndarray, list, tuple)) for d in datasets)


def _is_plain_array(dataset):
    """A numpy array of its own type, whose rows ``numpy.take`` copies
    exactly as ``dataset[i]`` gives them (a subclass, such as ``memmap``,
    gives rows of its own type)."""
    return type(dataset) is numpy.ndarray and not dataset.dtype.hasobject


class Columns(collections.abc.Sequence):
    """The examples ``structure`` (``'tuple'`` or ``'dict'``) of
    ``datasets[k][i]`` (``k`` over ``keys``) for each ``i`` of
    ``indices``."""

    def __init__(self, structure, keys, datasets, indices, length):
        self.structure = structure
        self.keys = tuple(keys)
        self.datasets = tuple(datasets)
        indices = numpy.asarray(indices)
        if indices.ndim != 1 or indices.size and indices.dtype.kind not in \
                'iu':
            raise TypeError('get_examples takes a sequence of int indices, '
                            'got {!r}'.format(indices))
        indices = indices.astype(numpy.intp, copy=False)
        if len(indices):
            low, high = indices.min(), indices.max()
            if low < -length or high >= length:
                bad = indices[(indices < -length) | (indices >= length)][0]
                raise IndexError('index {} is out of range for a dataset '
                                 'of length {}'.format(bad, length))
            if low < 0:
                # Never negative: numpy.take may then skip its bounds check.
                indices = numpy.where(indices < 0, indices + length, indices)
        self.indices = indices
        # Lists and the like are indexed now: an index error is the batch
        # method's, as dataset[i]'s would be.
        self._columns = [
            None if _is_plain_array(d) else
            [d[i] for i in self.indices.tolist()] for d in self.datasets]

    def take(self, k, out):
        """Copy the rows of array field ``k`` into ``out``; False (nothing
        written) when field ``k`` is not a plain numpy array."""
        dataset = self.datasets[k]
        if not _is_plain_array(dataset):
            return False
        # mode='clip' (the indices are checked) writes straight into
        # ``out``; 'raise' would go through a temporary buffer.
        numpy.take(dataset, self.indices, axis=0, out=out, mode='clip')
        return True

    def column(self, k):
        """The values of field ``k``, one per example, as ``dataset[i]``
        gives them (a row of an array, a numpy scalar of a 1-d one)."""
        column = self._columns[k]
        if column is None:
            column = self._columns[k] = list(numpy.take(
                self.datasets[k], self.indices, axis=0))
        return column

    def __len__(self):
        return len(self.indices)

    def _examples(self):
        columns = [self.column(k) for k in range(len(self.keys))]
        if self.structure == 'tuple':
            return list(zip(*columns))
        return [dict(zip(self.keys, values)) for values in zip(*columns)]

    def __iter__(self):
        return iter(self._examples())

    def __getitem__(self, j):
        if isinstance(j, slice):
            return self._examples()[j]
        values = [self.column(k)[j] for k in range(len(self.keys))]
        if self.structure == 'tuple':
            return tuple(values)
        return dict(zip(self.keys, values))

    def __repr__(self):
        return '<{} examples of {} fields, held as columns>'.format(
            len(self), len(self.keys))
