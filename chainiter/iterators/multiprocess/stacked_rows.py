"""Writing examples into the rows of a stacked slot, and reading them
back."""

import operator

import numpy

from chainiter.iterators.multiprocess.layout import Whole
from chainiter.iterators.multiprocess.stacked_layout import (
    Rows, _columns, _field_padding, _native, padded_fields)

_ndim = operator.attrgetter('ndim')
_dtype = operator.attrgetter('dtype')
_shape = operator.attrgetter('shape')
# Rows up to this size are gathered with one bytes.join (a temporary copy
# that larger rows would pay for in page faults).
_JOIN_BYTES = 4096
# The field dtype numpy.asarray gives a list of these Python numbers.
_PLAIN = {numpy.dtype(int).str: int, numpy.dtype(float).str: float}


def write_stacked_chunk(whole, layout, start_row, examples):
    """Write a chunk of examples into rows ``start_row...``.

    Returns ``Rows``, or None when an example does not fit (then write
    them one by one).  It costs a few numpy calls per field, not per
    example.
    """
    n = len(examples)
    columns = _columns(layout, examples)
    if columns is None:
        return None
    padded = set(padded_fields(layout))
    tops = {}
    for i, (field, column) in enumerate(zip(layout.fields, columns)):
        start = field.offset + start_row * field.row_bytes
        dst = whole[start:start + n * field.row_bytes].view(
            field.dtype).reshape((n,) + field.capacity)
        first = column[0]
        if i not in padded:
            try:
                if type(first) is numpy.ndarray and \
                        field.row_bytes <= _JOIN_BYTES:
                    # Arrays (numpy scalars too, as concat_examples takes
                    # them) of exactly the field's dtype and shape: one
                    # copy of all their bytes is far cheaper per example
                    # than concatenate or stack.
                    if set(map(_shape, column)) != {field.capacity}:
                        raise ValueError(field.capacity)
                    dtypes = set(map(_dtype, column))
                    if dtypes != {dst.dtype}:
                        # concat_examples gives native byte order: arrays
                        # of the other order are swapped, never mixed.
                        if {_native(d) for d in dtypes} != {dst.dtype}:
                            raise ValueError(dtypes)
                        numpy.stack(column, out=dst, casting='equiv')
                        continue
                    try:
                        data = b''.join(column)
                    except (BufferError, TypeError, ValueError):
                        # Not contiguous: numpy follows the strides.
                        numpy.stack(column, out=dst, casting='no')
                    else:
                        dst.reshape(-1)[...] = numpy.frombuffer(
                            data, dtype=dst.dtype)
                elif type(first) is numpy.ndarray:
                    # Rows this large have a shape (a 0-d row is one item).
                    # concatenate is far cheaper than stack, and it checks
                    # every dimension but the first: check that one (and
                    # the number of dimensions) first.
                    if set(map(_ndim, column)) != {len(field.capacity)} or \
                            set(map(len, column)) != {field.capacity[0]}:
                        raise ValueError(field.capacity)
                    numpy.concatenate(
                        column, out=dst.reshape((-1,) + field.capacity[1:]),
                        casting='no')
                elif set(map(type, column)) == {_PLAIN.get(field.dtype)}:
                    dst[...] = column   # Python ints or floats, unconverted
                else:
                    values = numpy.asarray(column)
                    if values.dtype.str != field.dtype or \
                            values.shape != dst.shape:
                        raise TypeError(values.dtype)
                    dst[...] = values
            except (AttributeError, OverflowError, TypeError, ValueError):
                return None
            continue
        pad = _field_padding(layout, field.key)
        capacity = field.capacity
        dtype = dst.dtype
        if len(capacity) == 1:     # the common ragged case: sequences
            if set(map(type, column)) != {numpy.ndarray} or \
                    set(map(_dtype, column)) != {dtype} or \
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
            tops[i] = (top,)
            continue
        top = None
        for row, value in enumerate(column):
            if type(value) is not numpy.ndarray or value.dtype != dtype or \
                    value.ndim != len(capacity) or any(
                        a > b for a, b in zip(value.shape, capacity)):
                return None
            target = dst[row]
            target.fill(pad)
            target[tuple(slice(d) for d in value.shape)] = value
            top = value.shape if top is None else tuple(
                map(max, top, value.shape))
        tops[i] = top
    return Rows(n, tops)


def as_rows(layout, metas):
    """``Rows`` for per-example results that all fitted; else ``metas``."""
    if any(type(m) is Whole for m in metas):
        return metas
    return Rows(len(metas), _tops(padded_fields(layout),
                                  [[m[i] for m in metas] for i in
                                   padded_fields(layout)]))


def _tops(indices, shape_lists):
    tops = {}
    for i, shapes in zip(indices, shape_lists):
        top = None
        for shape in shapes:
            top = shape if top is None else tuple(map(max, top, shape))
        tops[i] = top
    return tops


def _field_value(layout, example, key):
    if layout.structure == 'tuple':
        if not isinstance(example, tuple) or len(example) != len(
                layout.fields):
            raise KeyError(key)
        return example[key]
    if layout.structure == 'dict':
        if not isinstance(example, dict) or example.keys() != {
                f.key for f in layout.fields}:
            raise KeyError(key)
        return example[key]
    if isinstance(example, (tuple, dict)):
        raise KeyError(key)
    return example


def write_stacked_example(whole, layout, row, example):
    """Write ``example`` into row ``row``; return the tuple of its field
    shapes, or None when it does not fit the layout."""
    shapes = []
    checked = []
    for field in layout.fields:
        try:
            value = numpy.asarray(_field_value(layout, example, field.key))
        except KeyError:
            return None
        if value.dtype.str != field.dtype or value.ndim != len(
                field.capacity):
            return None
        padding = _field_padding(layout, field.key)
        if padding is None:
            if value.shape != field.capacity:
                return None
        elif any(a > b for a, b in zip(value.shape, field.capacity)):
            return None
        checked.append((field, value, padding))
        shapes.append(value.shape)
    for field, value, padding in checked:
        start = field.offset + row * field.row_bytes
        dst = whole[start:start + field.row_bytes].view(
            field.dtype).reshape(field.capacity)
        if padding is None or value.shape == field.capacity:
            dst[...] = value
        else:
            dst.fill(padding)
            dst[tuple(slice(n) for n in value.shape)] = value
    return tuple(shapes)


def example_shapes(layout, metas):
    """Per example: the tuple of its field shapes, or the ``Whole`` it came
    as; from the chunks' results (``Rows`` or per-example lists).  For an
    example of ``Rows`` a padded field's shape is the chunk's largest: cut
    there, its row still holds the example followed by padding, which
    ``concat_examples`` with that padding turns into the same batch."""
    out = []
    for meta in metas:
        if type(meta) is not Rows:
            out.extend(meta)
            continue
        shapes = tuple(meta.tops.get(i) or field.capacity
                       for i, field in enumerate(layout.fields))
        out.extend([shapes] * meta.n)
    return out


def tops_of(layout, metas):
    """The largest shape of each padded field over chunks of ``Rows``."""
    return _tops(padded_fields(layout),
                 [[m.tops[i] for m in metas] for i in padded_fields(layout)])


def read_stacked(base, layout, n, tops):
    """The stacked batch of ``n`` rows as views of ``base`` (the slot's
    bytes); ``tops`` gives the batch's largest shape of padded fields."""
    out = []
    for i, field in enumerate(layout.fields):
        rows = numpy.ndarray((n,) + field.capacity, field.dtype, base,
                             field.offset)
        top = tops.get(i)
        if top is not None and top != field.capacity:
            rows = rows[(slice(None),) + tuple(slice(t) for t in top)]
        out.append(rows)
    if layout.structure == 'tuple':
        return tuple(out)
    if layout.structure == 'dict':
        return {field.key: array for field, array in zip(layout.fields, out)}
    return out[0]


def unstack(base, layout, shapes):
    """The examples of a stacked slot as views, each cut to its own shapes
    (``shapes[j]`` is a tuple of field shapes), for the rare batch that has
    to be converted in the parent."""
    n = len(shapes)
    full = read_stacked(base, layout, n, {})
    if layout.structure == 'single':
        full = (full,)
    elif layout.structure == 'dict':
        full = tuple(full[f.key] for f in layout.fields)
    examples = []
    for j in range(n):
        values = [array[(j,) + tuple(slice(d) for d in shape)]
                  for array, shape in zip(full, shapes[j])]
        if layout.structure == 'tuple':
            examples.append(tuple(values))
        elif layout.structure == 'dict':
            examples.append({f.key: v for f, v in zip(layout.fields, values)})
        else:
            examples.append(values[0])
    return examples

