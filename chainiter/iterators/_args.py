"""The checks of constructor arguments, in one place so that they agree:
integers may be Python or numpy integers, never bools."""

import multiprocessing

import numpy


def positive_int(name, value, allow_none=False, hint=''):
    """``value`` as an int >= 1 (or None when ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, numpy.bool_)) or not isinstance(
            value, (int, numpy.integer)) or value <= 0:
        raise ValueError('{} must be a positive int{}, got {!r}{}'.format(
            name, ' or None' if allow_none else '', value, hint))
    return int(value)


def seconds(name, value):
    """A positive, finite number of seconds, or None."""
    if value is None:
        return None
    if isinstance(value, (bool, numpy.bool_)) or not isinstance(
            value, (int, float, numpy.integer, numpy.floating)) or \
            not 0 < value < float('inf'):
        raise ValueError(
            '{} must be a positive number of seconds, or None; got '
            '{!r}'.format(name, value))
    return float(value)


def callable_or_none(name, value):
    if value is not None and not callable(value):
        raise TypeError('{} must be callable, got {!r}'.format(name, value))
    return value


def dataset(value):
    """``value`` if it can be a dataset: ``len()`` and indexing by
    position."""
    missing = [name for name in ('__len__', '__getitem__')
               if not hasattr(value, name)]
    if missing:
        raise TypeError(
            'dataset must support len() and indexing (define __len__ and '
            '__getitem__, or wrap your data in chainiter.datasets.'
            'TupleDataset); {} lacks {}'.format(
                type(value).__name__, ' and '.join(missing)))
    positional(value)
    return value


def shuffles(shuffle, order_sampler):
    """Whether the order is a seeded shuffle: ``shuffle=None`` means
    shuffle unless an order sampler is given; both given is an error."""
    if shuffle is not None and order_sampler is not None:
        raise ValueError(
            'pass either shuffle or order_sampler, not both: '
            'shuffle={!r}, order_sampler={!r}'.format(
                shuffle, order_sampler))
    return order_sampler is None and (shuffle is None or bool(shuffle))


def repeatable(repeat, length):
    """Refuse ``repeat=True`` over an empty dataset (no batch, ever)."""
    if repeat and length == 0:
        raise ValueError(
            'the dataset is empty, so an iterator with repeat=True would '
            'never produce a batch; pass a non-empty dataset or '
            'repeat=False')


def start_method(value):
    """A start method of multiprocessing this platform has, or None (the
    default); else an error naming the ones it has (multiprocessing's own
    says only 'cannot find context')."""
    if value is None:
        return None
    methods = multiprocessing.get_all_start_methods()
    if not isinstance(value, str) or value not in methods:
        raise ValueError(
            'start_method must be one of {} (the start methods of '
            'multiprocessing on this platform) or None for Python\'s '
            'default, got {!r}'.format(
                ', '.join(map(repr, methods)), value))
    return value


def positional(dataset):
    """Refuse a pandas DataFrame, and a Series whose index is not
    0, 1, 2, ...: their ``[i]`` is a column or a label, not the i-th row.
    pandas is recognised by its classes' module, never imported."""
    kind = next((cls.__name__ for cls in type(dataset).__mro__
                 if cls.__module__.split('.')[0] == 'pandas' and
                 cls.__name__ in ('DataFrame', 'Series')), None)
    if kind is None:
        return
    index = getattr(dataset, 'index', None)
    if kind == 'Series' and type(index).__name__ == 'RangeIndex' and \
            index.start == 0 and index.step == 1:
        return     # labels 0, 1, 2, ... are the positions
    what = ('a pandas DataFrame: df[i] is column i, not row i' if
            kind == 'DataFrame' else
            'a pandas Series whose index ({}) is not 0, 1, 2, ...: s[i] is '
            'the value labelled i, not the i-th'.format(type(index).__name__))
    raise TypeError(
        'the dataset is {} (rows by position are .iloc[i]). Pass arrays: '
        'chainiter.datasets.TupleDataset(df[col].to_numpy(), ...) or '
        'df.to_numpy() (s.to_numpy() for a Series), or a dataset whose '
        '__getitem__ returns df.iloc[i]'.format(what))
