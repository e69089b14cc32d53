"""The list layout: every example gets a region of the slot, and the arrays
of its top-level fields are written one after another."""

import typing

import numpy

from chainiter.iterators.pipeline.memory.layout import (
    Layout, ShmRef, align)

# ---- the list layout -----------------------------------------------------

# The list layout puts in shared memory the plain ndarrays of a plain
# tuple, a plain dict or a bare example.  Anything else (a namedtuple, an
# OrderedDict, ndarray subclasses such as matrix, recarray or MaskedArray,
# arrays of objects) is pickled whole, so that it arrives as it was.

def _in_shm(value):
    return type(value) is numpy.ndarray and not value.dtype.hasobject


def _fields_of(example):
    if type(example) is tuple:
        return enumerate(example)
    if type(example) is dict:
        return example.items()
    return [(None, example)]


def example_array_bytes(example):
    """Bytes the top-level arrays of ``example`` take in the list layout."""
    return sum(align(value.nbytes) for _, value in _fields_of(example)
               if _in_shm(value))


def list_layout(batch_size, example_bytes):
    example_bytes = align(example_bytes)
    return Layout('list', batch_size * example_bytes, example_bytes)


def write_list_example(whole, start, layout, example):
    """Write the arrays of ``example`` at ``start``; return the example with
    ``ShmRef``s in their place, or None when they do not fit."""
    if example_array_bytes(example) > layout.example_bytes:
        return None
    offset = start

    def put(value):
        nonlocal offset
        if not _in_shm(value):
            return value
        n = value.nbytes
        dst = whole[offset:offset + n].view(value.dtype).reshape(value.shape)
        numpy.copyto(dst, value)
        ref = ShmRef(offset, n, value.shape, value.dtype)
        offset += align(n)
        return ref

    if type(example) is tuple:
        return tuple(put(value) for value in example)
    if type(example) is dict:
        return {key: put(value) for key, value in example.items()}
    return put(example)


def read_list_example(base, meta):
    """Rebuild an example from ``write_list_example``'s result, its arrays
    viewing ``base`` (the slot's bytes)."""
    def get(value):
        if type(value) is not ShmRef:
            return value
        start = value.offset
        return base[start:start + value.nbytes].view(value.dtype).reshape(
            value.shape)

    if type(meta) is tuple:
        return tuple(get(value) for value in meta)
    if type(meta) is dict:
        return {key: get(value) for key, value in meta.items()}
    return get(meta)


class UniformRows(typing.NamedTuple):
    """A chunk of ``n`` list-layout examples of one structure whose arrays
    keep their dtype and number of dimensions.  Fields of one shape sit at
    the same offset of every example's region and are written with one
    numpy call each and read back as row views; fields whose shape varies
    follow them, at offsets listed per example."""
    n: int
    structure: str               # 'tuple', 'dict' or 'single'
    keys: tuple                  # tuple positions or dict keys, in order
    arrays: tuple                # (key, offset, nbytes, shape, dtype)
    ragged: tuple                # (key, dtype, [(offset, nbytes, shape)])
    others: list                 # per example, the non-array values


def _structure(example):
    if type(example) is tuple:
        return 'tuple', tuple(range(len(example)))
    if type(example) is dict:
        return 'dict', tuple(example)
    return 'single', (None,)


def _get(example, structure, key):
    return example if structure == 'single' else example[key]


def write_list_chunk(whole, start, layout, examples):
    """Write a chunk of list-layout examples starting at byte ``start``;
    ``UniformRows``, or None when they differ in structure, dtypes or
    dimensions or one does not fit (then write them one by one)."""
    first = examples[0]
    structure, keys = _structure(first)
    for example in examples:
        if _structure(example) != (structure, keys):
            return None
    n = len(examples)
    fixed, varying = [], []
    for key in keys:
        value = _get(first, structure, key)
        if not _in_shm(value):
            continue
        column = [_get(e, structure, key) for e in examples]
        dtype, ndim, shape = value.dtype, value.ndim, value.shape
        if not all(type(v) is numpy.ndarray and v.dtype == dtype and
                   v.ndim == ndim for v in column):
            return None
        same = all(v.shape == shape for v in column)
        (fixed if same else varying).append((key, column))
    regions = whole[start:start + n * layout.example_bytes].reshape(
        n, layout.example_bytes)
    arrays = []
    offset = 0
    for key, column in fixed:
        value = column[0]
        arrays.append((key, offset, value.nbytes, value.shape, value.dtype))
        offset += align(value.nbytes)
    ends = [offset] * n
    ragged = []
    for key, column in varying:
        places = []
        for row, value in enumerate(column):
            places.append((ends[row], value.nbytes, value.shape))
            ends[row] += align(value.nbytes)
        ragged.append((key, column[0].dtype, places))
    if max(ends) > layout.example_bytes:
        return None
    for (_, column), (_, offset, nbytes, shape, dtype) in zip(fixed, arrays):
        dst = regions[:, offset:offset + nbytes].view(dtype).reshape(
            (n,) + shape)
        numpy.stack(column, out=dst)
    for (_, column), (_, dtype, places) in zip(varying, ragged):
        for row, (value, (offset, nbytes, shape)) in enumerate(
                zip(column, places)):
            regions[row, offset:offset + nbytes].view(dtype).reshape(
                shape)[...] = value
    array_keys = {key for key, _ in fixed + varying}
    other_keys = [k for k in keys if k not in array_keys]
    others = [tuple(_get(e, structure, k) for k in other_keys)
              for e in examples] if other_keys else None
    return UniformRows(n, structure, keys, tuple(arrays), tuple(ragged),
                       others)


def read_list_chunk(base, start, layout, rows):
    """The examples of a ``UniformRows`` chunk; its arrays view ``base``
    (the slot's bytes), from byte ``start`` of the slot."""
    n = rows.n
    regions = base[start:start + n * layout.example_bytes].reshape(
        n, layout.example_bytes)
    columns = {}
    for key, offset, nbytes, shape, dtype in rows.arrays:
        column = regions[:, offset:offset + nbytes].view(dtype).reshape(
            (n,) + shape)
        # list() of a column of 0-d rows would give numpy scalars.
        columns[key] = list(column) if shape else [
            column[row, ...] for row in range(n)]
    for key, dtype, places in rows.ragged:
        columns[key] = [
            regions[row, offset:offset + nbytes].view(dtype).reshape(shape)
            for row, (offset, nbytes, shape) in enumerate(places)]
    if rows.others is not None:
        other_keys = [k for k in rows.keys if k not in columns]
        for i, key in enumerate(other_keys):
            columns[key] = [values[i] for values in rows.others]
    if rows.structure == 'single':
        return columns[None]
    ordered = [columns[key] for key in rows.keys]
    if rows.structure == 'tuple':
        return list(zip(*ordered))
    return [dict(zip(rows.keys, values)) for values in zip(*ordered)]

