"""A batch of examples whose arrays are rows of the batch already stacked.

``MultiprocessIterator`` without a converter hands out a list of
examples, as Chainer's iterators do, while its workers still stack the
batch in shared memory: the list is a ``StackedExamples``, each example
made of views of the stacked rows (each array cut to its own shape, and
its scalars as they were loaded), and ``concat_examples`` of it returns
the stacked arrays without a copy: without padding when the examples'
arrays have one shape, and with ``padding=0`` (the rows' padding) too.

It is a list in every other way: indexing, ``len``, iteration, equality,
slicing (a plain list), pickling and copying (a plain list), and
``type(batch)(items)`` (how Lightning's ``apply_to_collection`` and other
tree maps rebuild a sequence) makes a list of ``items`` with no stacked
arrays.  A change to
the list (``batch[0] = ...``, ``append``, ``sort``...) or to a dict
example's values drops the stacked arrays, and ``concat_examples`` then
stacks the examples as they are now.  A change inside an example's array
is the stacked array's too (the example views it).
"""

import numbers
import operator

_shape = operator.attrgetter('shape')


class StackedExamples(list):
    """The examples of a batch (a list) and, in ``stacked``, the stacked
    arrays they view.  ``padding``: None, or the padding of the rows (a
    tuple, a dict or one value, as ``concat_examples`` takes it: 0 for a
    field of arrays of several shapes, None for the others); for dict
    examples ``rows`` holds each key's values, to tell a changed
    example."""

    __slots__ = ('stacked', 'padding', 'rows')

    def __init__(self, examples=(), stacked=None, padding=None, rows=None):
        super().__init__(examples)
        self.stacked = stacked
        self.padding = padding
        self.rows = rows

    def stacked_for(self, padding):
        """What ``concat_examples(self, padding=padding)`` makes of the
        examples, when the stacked arrays are that: the list is unchanged
        and ``padding`` pads the padded fields as the rows are padded
        (with 0); else None."""
        stacked = self.stacked
        if stacked is None or not _pads_alike(self.padding, padding):
            return None
        if self.rows is not None:
            # Dict examples can change in place: their values must still
            # be the rows they were made of.
            n = len(self.rows)
            for key, values in self.rows.items():
                for example, value in zip(self, values):
                    if type(example) is not dict or len(example) != n or \
                            example.get(key) is not value:
                        self.stacked = None
                        return None
        return stacked

    def cut(self, a, b):
        """Examples ``a...b - 1`` as a ``StackedExamples`` of their rows
        (a padded field's rows cut to its longest example there, as
        ``concat_examples`` pads them)."""
        examples = self[a:b]
        stacked = _rows(self.stacked, a, b)
        padding = self.padding
        if stacked is not None and padding is not None:
            if type(stacked) is tuple:
                stacked = tuple(
                    _cut_to([e[k] for e in examples], array)
                    if padding[k] is not None else array
                    for k, array in enumerate(stacked))
            elif type(stacked) is dict:
                stacked = {key: _cut_to([e[key] for e in examples], array)
                           if padding.get(key) is not None else array
                           for key, array in stacked.items()}
            else:
                stacked = _cut_to(examples, stacked)
        return StackedExamples(
            examples, stacked, padding,
            None if self.rows is None else
            {key: values[a:b] for key, values in self.rows.items()})

    def __reduce_ex__(self, protocol):
        return list, (list(self),)

    def __copy__(self):
        return list(self)


def _pads_alike(rows, asked):
    """Whether ``concat_examples`` with padding ``asked`` gives the rows
    padded with ``rows``: each field the rows pad (with 0) asked to pad
    with 0, the others asked anything (their arrays have one shape)."""
    if rows is None:
        return asked is None or _zero(asked)
    if type(rows) is tuple:
        if type(asked) is not tuple:
            asked = (asked,) * len(rows)
        return len(asked) == len(rows) and all(
            r is None or _zero(a) for r, a in zip(rows, asked))
    if type(rows) is dict:
        if type(asked) is not dict:
            asked = dict.fromkeys(rows, asked)
        return all(r is None or _zero(asked.get(key))
                   for key, r in rows.items())
    return _zero(asked)


def _zero(value):
    return isinstance(value, numbers.Number) and not isinstance(
        value, complex) and value == 0


def _cut_to(arrays, rows):
    """``rows`` (padded) cut to the largest shape of ``arrays``."""
    if rows.ndim == 2:      # sequences: the common case
        return rows[:, :max(map(len, arrays))]
    top = map(max, zip(*map(_shape, arrays)))
    return rows[(slice(None),) + tuple(map(slice, top))]


def _rows(stacked, a, b):
    if stacked is None:
        return None
    if type(stacked) is tuple:
        return tuple(array[a:b] for array in stacked)
    if type(stacked) is dict:
        return {key: array[a:b] for key, array in stacked.items()}
    return stacked[a:b]


def _dropping(name):
    method = getattr(list, name)

    def changed(self, *args, **kwargs):
        self.stacked = None
        return method(self, *args, **kwargs)
    changed.__name__ = name
    changed.__doc__ = method.__doc__
    return changed


for _name in ('__setitem__', '__delitem__', '__iadd__', '__imul__',
              'append', 'extend', 'insert', 'pop', 'remove', 'clear',
              'sort', 'reverse'):
    setattr(StackedExamples, _name, _dropping(_name))
del _name
