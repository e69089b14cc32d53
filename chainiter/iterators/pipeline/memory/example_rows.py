"""Writing the examples of a chunk into the rows of a stacked slot one
by one (``ExampleRows``, ``write_stacked_example``), where the chunk's
rows cannot be written at once (``stacked_rows.write_stacked_chunk``),
and the ``Rows`` the examples make (``as_rows``)."""

import numpy

from chainiter.iterators.pipeline.memory.exact_rows import exact_columns
from chainiter.iterators.pipeline.memory.layout import Whole
from chainiter.iterators.pipeline.memory.row_values import (
    ARRAY, NUMPY_SCALAR, PYTHON_SCALAR, kind_of, native_dtype, row_spec,
    spec_bytes)
from chainiter.iterators.pipeline.memory.stacked_layout import (
    Rows, field_padding, padded_fields)
from chainiter.iterators.pipeline.memory.stacked_read import largest_shapes

# The dtypes numpy makes of a Python float and bool.
_FLOAT = numpy.dtype(float)
_BOOL = numpy.dtype(bool)
# The kinds of value _write_like takes.
_LIKE = (ARRAY, NUMPY_SCALAR, PYTHON_SCALAR)


def _field_value(layout, example, key):
    if layout.exact:
        value = _exact_value(layout, example, key)
        if not exact_columns([[value]]):
            raise KeyError(key)
        return value
    return _any_value(layout, example, key)


def _exact_value(layout, example, key):
    """The field ``key`` of an example of exactly a tuple or a dict
    (``Layout.exact``: a namedtuple or an OrderedDict would come back as
    the plain one)."""
    if layout.structure == 'tuple' and type(example) is not tuple or \
            layout.structure == 'dict' and type(example) is not dict:
        raise KeyError(key)
    return _any_value(layout, example, key)


def _any_value(layout, example, key):
    if layout.structure == 'tuple':
        if not isinstance(example, tuple) or len(example) != len(
                layout.fields):
            raise KeyError(key)
        return example[key]
    if layout.structure == 'dict':
        # The keys in the rows' order: a dict read back from the rows, or
        # stacked from them, has that order.
        if not isinstance(example, dict) or tuple(example) != tuple(
                f.key for f in layout.fields):
            raise KeyError(key)
        return example[key]
    if isinstance(example, (tuple, dict)):
        raise KeyError(key)
    return example


def write_stacked_example(whole, layout, start_row, row, example, specs):
    """Write ``example`` into row ``row`` of a chunk that starts at row
    ``start_row``; return the tuple of its fields' ``(dtype str, shape,
    kind)`` (``kind_of`` the value), or None when it does not fit the
    layout.

    ``specs`` (a list, one entry per field, kept by the caller for the
    chunk) holds the dtype and shape of the chunk's rows of each field
    without padding, set by the first example written: the rows of a
    chunk lie one after another, so every later example must have them.
    """
    out = []
    checked = []
    padded = padded_fields(layout)
    for i, field in enumerate(layout.fields):
        try:
            value = _field_value(layout, example, field.key)
        except KeyError:
            return None
        kind = kind_of(value)
        if i not in padded:
            spec = row_spec(value)
            if spec is None:
                return None
            size = spec_bytes(spec)
            if size > field.row_bytes or (
                    specs[i] is not None and specs[i] != spec):
                return None
            value = numpy.asarray(value)
            dtype, shape = spec
            if value.shape != shape or native_dtype(value.dtype) != dtype or (
                    value.dtype != dtype and kind == ARRAY and
                    field_padding(layout, field.key) is not None):
                # (concat_examples pads arrays into the first's dtype,
                # byte order and all.)
                return None
            start = field.offset + start_row * field.row_bytes + \
                (row - start_row) * size
            checked.append((i, value, dtype, shape, None, start, size))
            out.append((dtype.str, shape, kind))
            continue
        # Only arrays are padded: concat_examples pads a field when its
        # first value is an array, and gives lists to numpy.asarray.
        if kind != ARRAY or value.dtype.str != field.dtype or \
                value.ndim != len(field.capacity) or any(
                    a > b for a, b in zip(value.shape, field.capacity)):
            return None
        value = numpy.asarray(value)
        padding = field_padding(layout, field.key)
        checked.append((i, value, field.dtype, field.capacity, padding,
                        field.offset + row * field.row_bytes,
                        field.row_bytes))
        out.append((field.dtype, value.shape, ARRAY))
    for i, value, dtype, shape, padding, start, size in checked:
        if i not in padded:
            specs[i] = (numpy.dtype(dtype), shape)
        dst = whole[start:start + size].view(dtype).reshape(shape)
        if padding is None or value.shape == shape:
            dst[...] = value
        else:
            dst.fill(padding)
            dst[tuple(slice(n) for n in value.shape)] = value
    return tuple(out)


class ExampleRows:
    """Writes the examples of a chunk that starts at row ``start_row``
    one by one (``write``).  Once the first is written, the later ones
    that have its dtypes and shapes exactly, as most have, take a short
    way: one type and shape check and one copy per field, into views of
    the chunk's rows made once.  Anything else goes through
    ``write_stacked_example``, which decides as before; the bytes and the
    results are the same either way."""

    def __init__(self, whole, layout, start_row):
        self.whole, self.layout, self.start = whole, layout, start_row
        self.specs = [None] * len(layout.fields)
        self._like = None       # from the first example; False: none

    def write(self, row, example):
        """``write_stacked_example``'s result for ``example`` at ``row``."""
        like = self._like
        if like:
            meta = _write_like(like, row - self.start, example)
            if meta is not None:
                return meta
        meta = write_stacked_example(self.whole, self.layout, self.start,
                                     row, example, self.specs)
        if like is None and meta is not None:
            self._like = _like_first(self.whole, self.layout, self.start,
                                     self.specs, meta) or False
        return meta


def _like_first(whole, layout, start_row, specs, meta):
    """``(structure, fields, meta)`` for ``_write_like``, or None where it
    does not apply (padded fields, dict examples, lists).  ``fields`` holds
    per field its dtype, shape, the kind of value, the range of Python
    ints it takes and a view of the chunk's rows; ``meta`` (the first
    example's) is the result of every such example."""
    if layout.padded or layout.structure not in ('tuple', 'single') or \
            None in specs or any(m[2] not in _LIKE for m in meta):
        return None
    offsets = sorted(f.offset for f in layout.fields) + [layout.slot_bytes]
    fields = []
    for field, (dtype, shape), field_meta in zip(layout.fields, specs,
                                                 meta):
        kind = field_meta[2]
        size = spec_bytes((dtype, shape))
        start = field.offset + start_row * field.row_bytes
        end = offsets[offsets.index(field.offset) + 1]
        n = (end - start) // size if size else 0
        if n <= 0:
            return None
        view = whole[start:start + n * size].view(dtype).reshape(
            (n,) + shape)
        ints = _int_range(dtype) if shape == () else None
        fields.append((dtype, shape, kind, ints, view))
    return layout.structure, tuple(fields), meta


def _int_range(dtype):
    """The Python ints ``numpy.asarray`` turns into ``dtype``: for the
    default int's dtype, those it holds; else none."""
    if dtype != numpy.dtype(int):
        return None
    info = numpy.iinfo(dtype)
    return int(info.min), int(info.max)


def _write_like(like, k, example):
    """Write ``example`` into the chunk's ``k``-th rows when each field
    has exactly the first example's dtype, shape and kind (an ndarray, a
    numpy scalar of that dtype, or a Python bool, int or float that numpy
    makes that dtype); its meta, or None (nothing written) when not."""
    structure, fields, meta = like
    if structure == 'tuple':
        if type(example) is not tuple or len(example) != len(fields):
            return None
        values = example
    else:
        values = (example,)
    for value, (dtype, shape, want, ints, _) in zip(values, fields):
        kind = type(value)
        if kind is numpy.ndarray:
            if want is not ARRAY or value.dtype != dtype or \
                    value.shape != shape:
                return None
        elif want is ARRAY or not (
                kind is dtype.type if want is NUMPY_SCALAR else
                (kind is float and dtype == _FLOAT) or
                (kind is bool and dtype == _BOOL) or
                (kind is int and ints is not None and
                 ints[0] <= value <= ints[1])):
            return None
    for value, (_, _, _, _, view) in zip(values, fields):
        view[k] = value
    return meta


def as_rows(layout, metas):
    """``Rows`` for per-example results that all fitted with the same
    dtypes and shapes (but for padded fields' shapes); else ``metas``.
    A field whose values differ in kind gives the kind of each."""
    if not metas or any(type(m) is Whole for m in metas):
        return metas
    padded = padded_fields(layout)
    specs = []
    for i, spec in enumerate(metas[0]):
        if i in padded:
            spec = None
        elif any(meta[i] != spec for meta in metas):
            if any(meta[i][:2] != spec[:2] for meta in metas):
                return metas
            spec = spec[:2] + (''.join(meta[i][2] for meta in metas),)
        specs.append(spec)
    shapes = {i: [m[i][1] for m in metas] for i in padded}
    return Rows(len(metas), largest_shapes(padded, list(shapes.values())),
                tuple(specs), shapes if layout.exact else None)
