"""Writing a chunk of examples into the rows of a stacked slot at once
(``write_stacked_chunk``), a few numpy calls per field: one step per kind
of field (rows without padding, padded rows of one dimension, padded rows
of several).  ``example_rows.py`` writes the chunks this cannot, one
example at a time; ``stacked_read.py`` reads the rows back.  A list
batch's chunk (``Layout.exact``) is written here only when its examples
come back from the rows as they were (``exact_rows.exact_columns``),
which the steps check on the way."""

import operator

import numpy

from chainiter.iterators.pipeline.memory.row_values import (
    PYTHON_SCALARS, kind_of, native_dtype, row_spec, spec_bytes)
from chainiter.iterators.pipeline.memory.stacked_layout import (
    Rows, example_columns, field_padding, padded_fields)

_ndim = operator.attrgetter('ndim')
_dtype = operator.attrgetter('dtype')
_shape = operator.attrgetter('shape')
# Rows up to this size are gathered with one bytes.join (a temporary copy
# that larger rows would pay for in page faults).
_JOIN_BYTES = 4096
# The field dtype numpy.asarray gives a list of these Python numbers.
_PLAIN = {numpy.dtype(int).str: int, numpy.dtype(float).str: float}
# Values of one of these types (all of the same) have one dtype.
_SCALARS = (numpy.generic, bool, int, float, complex)


def write_stacked_chunk(whole, layout, start_row, examples):
    """Write a chunk of examples into rows ``start_row...``.

    Returns ``Rows``, or None when an example does not fit (then write
    them one by one).  It costs a few numpy calls per field, not per
    example.
    """
    n = len(examples)
    columns = example_columns(layout, examples)
    if columns is None:
        return None
    padded = set(padded_fields(layout))
    tops = {}
    specs = []
    shapes = {} if layout.exact and padded else None
    for i, (field, column) in enumerate(zip(layout.fields, columns)):
        start = field.offset + start_row * field.row_bytes
        if i not in padded:
            spec = _write_unpadded(whole, layout, field, start, column)
            if spec is None:
                return None
            specs.append(spec)
            continue
        if layout.exact and not numpy.dtype(field.dtype).isnative:
            return None     # a list batch's arrays would come back swapped
        specs.append(None)
        dst = whole[start:start + n * field.row_bytes].view(
            field.dtype).reshape((n,) + field.capacity)
        pad = field_padding(layout, field.key)
        write = _write_padded_1d if len(field.capacity) == 1 else \
            _write_padded_nd
        written = write(dst, pad, column, shapes is not None)
        if written is None:
            return None
        tops[i], field_shapes = written
        if shapes is not None:
            shapes[i] = field_shapes
    return Rows(n, tops, tuple(specs), shapes)


def _write_unpadded(whole, layout, field, start, column):
    """Write the rows of a field without padding from byte ``start``; the
    rows' ``(dtype str, shape, kind)`` (for ``Rows.specs``), or None when
    a value does not fit them, or (``Layout.exact``: a list batch's) would
    not come back from them as it was (``exact_rows.exact_columns``, here
    checked on the way)."""
    # The rows take the dtype and shape of the chunk's first example,
    # when they fit; every other example must have them.
    first = column[0]
    spec = row_spec(first)
    if spec is None or spec_bytes(spec) > field.row_bytes:
        return None
    # The values are all of one kind, the first's (each step checks): the
    # rows tell the parent which (Rows.specs), should it have to stack the
    # batch itself.
    dtype, capacity = spec
    out = (dtype.str, capacity, kind_of(first))
    size = spec_bytes(spec)
    dst = whole[start:start + len(column) * size].view(dtype).reshape(
        (len(column),) + capacity)
    exact = layout.exact
    try:
        if type(first) is numpy.ndarray and size <= _JOIN_BYTES:
            _join_arrays(dst, capacity, column, layout, field.key, exact)
        elif type(first) is numpy.ndarray:
            if exact and set(map(type, column)) != {numpy.ndarray}:
                raise TypeError(column)
            # Rows this large have a shape (a 0-d row is one item).
            # concatenate is far cheaper than stack, and it checks every
            # dimension but the first: check that one (and the number of
            # dimensions) first.
            if set(map(_ndim, column)) != {len(capacity)} or \
                    set(map(len, column)) != {capacity[0]}:
                raise ValueError(capacity)
            # casting='no': of the rows' (native) dtype.
            numpy.concatenate(
                column, out=dst.reshape((-1,) + capacity[1:]), casting='no')
        elif set(map(type, column)) == {_PLAIN.get(dtype.str)}:
            dst[...] = column   # Python ints or floats, unconverted
        else:
            _convert_values(dst, dtype, column, exact)
    except (AttributeError, OverflowError, TypeError, ValueError):
        return None
    return out


def _join_arrays(dst, capacity, column, layout, key, exact):
    """Copy arrays of exactly the rows' dtype and shape into ``dst``: one
    copy of all their bytes is far cheaper per example than concatenate
    or stack.  (Numpy scalars, of shape () too, are of another kind.)
    Raises ValueError for values of another shape, kind or dtype, and
    (``exact``) for ndarray subclasses or arrays of the other byte order
    (the rows' is native)."""
    if set(map(_shape, column)) != {capacity} or (
            (exact or not capacity) and
            set(map(type, column)) != {numpy.ndarray}):
        raise ValueError(capacity)
    dtypes = set(map(_dtype, column))
    if dtypes != {dst.dtype}:
        if exact:
            raise ValueError(dtypes)
        # numpy.stack gives native byte order: arrays of the other order
        # are swapped, never mixed.  With padding concat_examples keeps
        # the first's order.
        native = {native_dtype(d) for d in dtypes}
        if native != {dst.dtype} or field_padding(
                layout, key) is not None:
            raise ValueError(dtypes)
        numpy.stack(column, out=dst, casting='equiv')
        return
    try:
        data = b''.join(column)
    except (BufferError, TypeError, ValueError):
        # Not contiguous: numpy follows the strides.
        numpy.stack(column, out=dst, casting='no')
    else:
        dst.reshape(-1)[...] = numpy.frombuffer(data, dtype=dst.dtype)


def _convert_values(dst, dtype, column, exact):
    """Write values that are not arrays of the rows' dtype nor plain
    Python ints or floats into ``dst``.

    Values of several types (numpy.int32 beside numpy.int64, a float
    beside an int), or lists, whose items may differ in type from example
    to example, promote one another here as concat_examples promotes a
    batch; but a chunk may hold several batches (a group of them), each
    with its own dtype: those go one by one, each example checked.  So do
    scalars of one type and another dtype (Python ints beyond int64:
    uint64 or float64 to numpy): TypeError.  So do (``exact``) values
    that would not come back from the rows as they were: lists, int
    subclasses (enums).
    """
    types = set(map(type, column))
    kind = types.pop() if len(types) == 1 else None
    if kind is None or not issubclass(kind, _SCALARS) or exact and not (
            kind in PYTHON_SCALARS or issubclass(kind, numpy.generic)):
        raise TypeError(types)
    values = numpy.asarray(column)
    if values.dtype != dtype or values.shape != dst.shape:
        raise TypeError(values.dtype)
    dst[...] = values


def _write_padded_1d(dst, pad, column, with_shapes):
    """Write sequences (the common ragged case) into the padded rows
    ``dst``, the rest of each row ``pad``; ``(the longest's shape, each
    one's shape or None)``, or None when a value does not fit."""
    capacity = dst.shape[1:]
    if set(map(type, column)) != {numpy.ndarray} or \
            set(map(_dtype, column)) != {dst.dtype} or \
            set(map(_ndim, column)) != {1}:
        return None
    lengths = list(map(len, column))
    top = max(lengths)
    if top > capacity[0]:
        return None
    if min(lengths) < capacity[0]:
        # The whole row: another chunk may make the batch longer.
        dst.fill(pad)
    for row, value, length in zip(dst, column, lengths):
        row[:length] = value
    shapes = [(length,) for length in lengths] if with_shapes else None
    return (top,), shapes


def _write_padded_nd(dst, pad, column, with_shapes):
    """Write arrays of several dimensions into the padded rows ``dst``,
    the rest of each row ``pad``; ``(the largest shape, each one's shape
    or None)``, or None when a value does not fit."""
    capacity = dst.shape[1:]
    dtype = dst.dtype
    top = None
    for row, value in enumerate(column):
        if type(value) is not numpy.ndarray or value.dtype != dtype or \
                value.ndim != len(capacity) or any(
                    a > b for a, b in zip(value.shape, capacity)):
            return None     # None or a Python value among them, too
        target = dst[row]
        target.fill(pad)
        target[tuple(slice(d) for d in value.shape)] = value
        top = value.shape if top is None else tuple(
            map(max, top, value.shape))
    return top, list(map(_shape, column)) if with_shapes else None
