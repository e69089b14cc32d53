"""A batch of examples whose arrays are rows of the batch already stacked.

``MultiprocessIterator`` without a converter hands out a list of
examples, as Chainer's iterators do, while its workers still stack the
batch in shared memory: the list is a ``StackedExamples``, each example
made of views of the stacked rows (and its scalars as they were loaded),
and ``concat_examples`` of it returns the stacked arrays without a copy.

It is a list in every other way: indexing, ``len``, iteration, equality,
slicing (a plain list), pickling and copying (a plain list).  A change to
the list (``batch[0] = ...``, ``append``, ``sort``...) or to a dict
example's keys drops the stacked arrays, and ``concat_examples`` then
stacks the examples as they are now.  A change inside an example's array
is the stacked array's too (the example views it).
"""


class StackedExamples(list):
    """The examples of a batch (a list) and, in ``stacked``, what
    ``concat_examples(batch)`` makes of them: views of the same memory.
    ``structure`` is ``'tuple'``, ``'dict'`` or ``'single'``; for dict
    examples ``rows`` holds each key's values, to tell a changed
    example."""

    __slots__ = ('stacked', 'structure', 'rows')

    def __init__(self, examples, stacked, structure, rows=None):
        super().__init__(examples)
        self.stacked = stacked
        self.structure = structure
        self.rows = rows

    def stacked_as_made(self):
        """``stacked`` while it still holds what ``concat_examples`` makes
        of the examples; else None."""
        stacked = self.stacked
        if stacked is None or self.rows is None:
            return stacked
        # Dict examples can change in place: their values must still be
        # the rows they were made of.
        for key, values in self.rows.items():
            for example, value in zip(self, values):
                if type(example) is not dict or len(example) != \
                        len(self.rows) or example.get(key) is not value:
                    self.stacked = None
                    return None
        return stacked

    def cut(self, a, b):
        """Examples ``a...b - 1`` as a ``StackedExamples`` of their
        rows."""
        return StackedExamples(
            self[a:b], _rows(self.stacked, a, b), self.structure,
            None if self.rows is None else
            {key: values[a:b] for key, values in self.rows.items()})

    def __reduce_ex__(self, protocol):
        return list, (list(self),)

    def __copy__(self):
        return list(self)


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
