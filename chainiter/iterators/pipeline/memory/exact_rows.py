"""List batches' rows (``Layout.exact``): which examples come back from
stacked rows as they were (``exact_columns``, ``exact_examples``), and
the examples read back from them as a ``StackedExamples``
(``listed_kinds``, ``example_list``)."""

import operator

import numpy

from chainiter.dataset.stacked_examples import StackedExamples

from chainiter.iterators.pipeline.memory.row_values import (
    ARRAY, PYTHON_SCALAR)
from chainiter.iterators.pipeline.memory.stacked_read import rows_specs

_dtype = operator.attrgetter('dtype')
# The types of value that come back from their rows as they were.
_EXACT = frozenset((numpy.ndarray, bool, int, float, complex))


def exact_columns(columns):
    """Whether every value of ``columns`` comes back from its row as it
    was (``restored``): each column of one type, either ndarrays of one
    dtype in native byte order, numpy scalars of one dtype, or Python
    bools, ints, floats or complex numbers.  Not a list (it would come
    back a list of another type, or a tuple as a list), an int subclass
    (an enum), an array of the other byte order, nor a column that mixes
    kinds (a 0-d array beside an int, None beside arrays, an int beside
    a float: the row would give them back of one kind)."""
    for column in columns:
        types = set(map(type, column))
        if len(types) != 1:
            return False
        kind, = types
        if kind is numpy.ndarray or issubclass(kind, numpy.generic):
            dtypes = set(map(_dtype, column))
            if len(dtypes) != 1 or not next(iter(dtypes)).isnative:
                return False
        elif kind not in _EXACT:
            return False
    return True


def exact_examples(examples):
    """Whether every example of a batch would come back from stacked
    rows as it was (``Layout.exact``): tuples of one length, dicts of
    the same keys in the same order, or bare values, of the types ``exact_columns``
    takes."""
    types = set(map(type, examples))
    if types == {tuple}:
        if len(set(map(len, examples))) != 1:
            return False
        columns = list(zip(*examples))
    elif types == {dict}:
        # Each dict comes back in the order of the rows' keys.
        keys = list(examples[0])
        if any(list(example) != keys for example in examples):
            return False
        columns = [[example[key] for example in examples] for key in keys]
    elif any(isinstance(example, (tuple, dict)) for example in examples):
        return False
    else:
        columns = [examples]
    return exact_columns(columns)


def listed_kinds(layout, chunks):
    """The kind of value of each field (``kind_of``), when every example
    of the chunks (all ``Rows``) has the same; else None."""
    kinds = None
    for chunk in chunks:
        specs = rows_specs(layout, chunk)
        if specs and (chunk.shapes or {}).keys() != set(layout.padded):
            return None
        these = tuple(ARRAY if spec is None else spec[2] for spec in specs)
        if None in these or any(len(k) != 1 for k in these) or \
                kinds is not None and these != kinds:
            return None
        kinds = these
    return kinds


def example_list(stacked, layout, kinds, chunks):
    """The examples of the stacked batch ``stacked`` (read with
    ``Layout.exact`` from ``chunks``, all ``Rows``) as they were loaded,
    a ``StackedExamples``: each array a view of its row (cut to its
    shape, in a padded field), each scalar of its type again."""
    values = list(stacked) if layout.structure == 'tuple' else \
        [stacked[f.key] for f in layout.fields] \
        if layout.structure == 'dict' else [stacked]
    columns = []
    for i, (value, kind) in enumerate(zip(values, kinds)):
        if i in layout.padded:
            shapes = [shape for chunk in chunks for shape in chunk.shapes[i]]
            if len(value.shape) == 2:
                columns.append([row[:shape[0]] for row, shape in
                                zip(value, shapes)])
            else:
                columns.append([row[tuple(map(slice, shape))] for row, shape
                                in zip(value, shapes)])
        elif kind == PYTHON_SCALAR:
            columns.append(value.tolist())
        elif kind == ARRAY and value.ndim == 1:
            # 0-d arrays: iterating would give numpy scalars.
            columns.append([value[i, ...] for i in range(len(value))])
        else:
            columns.append(list(value))
    padding = layout.padding if layout.padded else None
    if layout.structure == 'tuple':
        return StackedExamples(zip(*columns), stacked, padding)
    if layout.structure == 'dict':
        keys = [f.key for f in layout.fields]
        return StackedExamples(
            [dict(zip(keys, example)) for example in zip(*columns)],
            stacked, padding, dict(zip(keys, columns)))
    return StackedExamples(columns[0], stacked, padding)
