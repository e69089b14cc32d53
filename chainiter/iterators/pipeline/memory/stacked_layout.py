"""The stacked layout, measured from a batch: every field of the batch has
``row_bytes`` per example in the slot, one row after another.

A padded field's rows have the field's dtype and ``capacity`` shape (the
padding fills what an example leaves).  A field without padding takes
rows of any dtype and shape that fit its ``row_bytes``: the worker writes
a chunk's rows with the dtype and shape of its first example (when every
example of the chunk has them), contiguous from the chunk's first row,
and says which in ``Rows.specs``; a batch of one chunk, or of rows that
fill ``row_bytes``, is then one array of the slot.  So a bucketed dataset
(a batch of length-16 sequences, then one of 128) is written by the
workers whatever its bucket, once the bytes of the largest have been
seen; ``dtype`` and ``capacity`` are then those of the batch measured
last.  What a row was written from, and the row a value makes, is
``row_values.py``'s."""

import typing

import numpy

from chainiter.dataset.convert import concat_examples
from chainiter.iterators.pipeline.memory.layout import Field, Layout, align

# ---- the stacked layout --------------------------------------------------

def stacked_layout(batch, batch_size, padding, capacities=None,
                   row_bytes=None):
    """The stacked layout for batches like ``batch``, or None when
    ``concat_examples`` would not give numeric arrays for it.

    ``capacities`` (per padded field: a shape) and ``row_bytes`` (per
    other field: bytes) raise what is measured, to grow a layout.
    """
    try:
        stacked = concat_examples(batch, padding=padding)
    except Exception:
        return None
    first = batch[0]
    if isinstance(first, tuple):
        structure, keyed = 'tuple', list(enumerate(stacked))
    elif isinstance(first, dict):
        structure, keyed = 'dict', list(stacked.items())
    else:
        structure, keyed = 'single', [(None, stacked)]
    fields = []
    padded = []
    offset = 0
    for key, array in keyed:
        if not isinstance(array, numpy.ndarray) or array.dtype.kind not in \
                'biufc':
            return None
        capacity = array.shape[1:]
        # concat_examples pads a field only when the batch's first value
        # is an array: lists and the like it gives to numpy.asarray as
        # they are (ragged ones are an error).
        pad = padding_of(padding, key, structure) if isinstance(
            first if structure == 'single' else first[key],
            numpy.ndarray) else None
        if pad is not None and capacities is not None and key in capacities:
            capacity = tuple(max(a, b)
                             for a, b in zip(capacity, capacities[key]))
        size = int(numpy.prod(capacity, dtype=numpy.int64)) * \
            array.dtype.itemsize
        if pad is not None and capacity:
            padded.append(len(fields))
        elif row_bytes is not None and key in row_bytes:
            size = max(size, row_bytes[key])
        fields.append(Field(key, array.dtype.str, capacity, offset, size))
        offset += align(size * batch_size)
    return Layout('stacked', offset, structure=structure,
                  fields=tuple(fields), padding=padding, padded=tuple(padded))


def list_padding(batch, before=None, batch_size=None):
    """The padding of a layout for list batches like ``batch``
    (``Layout.exact``): 0 for each field of arrays whose shapes differ
    within a batch (of ``batch_size`` examples: ``batch`` may be a group
    of batches, each of its own bucket's shape), or that ``before``, the
    padding of the layout so far, pads; None for the others (a tuple, a
    dict or one value, as the examples are); None when no field needs
    it."""
    first = batch[0]
    n = batch_size or len(batch)

    def ragged(values):
        return any(_ragged(values[i:i + n]) for i in range(0, len(values), n))
    if isinstance(first, tuple):
        keys = range(len(first))
    elif isinstance(first, dict):
        keys = list(first)
    else:
        return 0 if before == 0 or ragged(batch) else None
    try:
        pads = {key: 0 if ragged([e[key] for e in batch]) or
                padding_of(before, key, 'tuple' if isinstance(first, tuple)
                           else 'dict') == 0 else None
                for key in keys}
    except (IndexError, KeyError, TypeError):
        return None
    if all(pad is None for pad in pads.values()):
        return None
    if isinstance(first, tuple):
        return tuple(pads[key] for key in keys)
    return pads


def _ragged(values):
    return all(type(v) is numpy.ndarray for v in values) and \
        len(set(v.shape for v in values)) > 1


def resized(layout, batch_size):
    """``layout`` with rows for ``batch_size`` examples."""
    fields = []
    offset = 0
    for field in layout.fields:
        fields.append(field._replace(offset=offset))
        offset += align(field.row_bytes * batch_size)
    return layout._replace(slot_bytes=offset, fields=tuple(fields))


def mismatch(old, new):
    """How the stacked layout ``new`` (measured from a later batch) differs
    from ``old`` in what no growth of ``old`` can hold, or None.  A field
    without padding takes rows of any dtype and shape that fit its bytes;
    a padded one keeps its dtype and number of dimensions."""
    if old.structure != new.structure or \
            [f.key for f in old.fields] != [f.key for f in new.fields]:
        return 'the structure of the examples'
    for i, (a, b) in enumerate(zip(old.fields, new.fields)):
        name = 'the field' if a.key is None else 'field {!r}'.format(a.key)
        if (i in old.padded) != (i in new.padded):
            return '{}: shape {} where the first batch had {}'.format(
                name, b.capacity, a.capacity)
        if i not in old.padded:
            continue
        if a.dtype != b.dtype:
            return '{}: dtype {} where the first batch had {}'.format(
                name, numpy.dtype(b.dtype), numpy.dtype(a.dtype))
        if len(a.capacity) != len(b.capacity):
            return '{}: shape {} where the first batch had {}'.format(
                name, b.capacity, a.capacity)
    return None


def grown(old, new, batch, batch_size, growth):
    """The layout for batches like ``batch`` and like those ``old`` holds
    (``new`` was measured from ``batch`` and matches ``old``), or None when
    ``old`` holds ``batch`` already.  A field that must grow grows at least
    by ``growth``, so that a dataset whose examples keep growing makes few
    new layouts."""
    capacities, sizes = {}, {}
    larger = False
    for i, (a, b) in enumerate(zip(old.fields, new.fields)):
        if i in old.padded:
            if any(x > y for x, y in zip(b.capacity, a.capacity)):
                larger = True
                capacities[a.key] = tuple(
                    max(x, int(numpy.ceil(y * growth)))
                    for x, y in zip(b.capacity, a.capacity))
            else:
                capacities[a.key] = a.capacity
        elif b.row_bytes > a.row_bytes:
            larger = True
            sizes[a.key] = max(b.row_bytes,
                               _round(numpy.ceil(a.row_bytes * growth)))
        else:
            sizes[a.key] = a.row_bytes
    if not larger:
        return None
    return stacked_layout(batch, batch_size, old.padding, capacities, sizes)


def widen(layout, batch, batch_size, example_bytes):
    """``layout`` with room for ``example_bytes`` of arrays per example
    (``shared_mem``, which counts the arrays, as Chainer's does: the rows
    of fields that are not arrays in ``batch``, a label, come on top):
    its padded fields lengthened (along their first dimension, all by
    the same factor) or, without any, the largest field given the bytes
    missing (the largest field of arrays: the one whose shape varies, in
    bucketed data); ``layout`` itself when it has the room already, or
    no field of arrays."""
    padded = [layout.fields[i] for i in padded_fields(layout)]
    arrays = [f for f, _ in _array_fields(layout, batch[0])]
    example_bytes += row_bytes(layout) - sum(f.row_bytes for f in arrays)
    have = row_bytes(layout)
    if have >= example_bytes or not arrays:
        return layout
    if not padded:
        largest = max(arrays, key=lambda f: f.row_bytes)
        return stacked_layout(batch, batch_size, layout.padding, None, {
            largest.key: _round(largest.row_bytes + example_bytes - have)})
    padded_bytes = sum(f.row_bytes for f in padded)
    factor = (example_bytes - (have - padded_bytes)) / max(padded_bytes, 1)
    capacities = {f.key: (int(numpy.ceil(f.capacity[0] * factor)),) +
                  f.capacity[1:] for f in padded}
    return stacked_layout(batch, batch_size, layout.padding, capacities)


def _round(size):
    """``size`` rounded up to whole items of any dtype (16 bytes)."""
    return -(-int(size) // 16) * 16


def padding_of(padding, key, structure):
    """The padding of field ``key`` of examples of ``structure``, as
    ``concat_examples`` reads ``padding``: a value for every field, a
    tuple with one per field of tuples, or a dict naming some keys of
    dicts (the others unpadded).  (A tuple for dicts or bare examples is
    one value, as is a dict for tuples.)"""
    if structure == 'dict' and isinstance(padding, dict):
        return padding.get(key)
    if structure == 'tuple' and isinstance(padding, tuple):
        return padding[key]
    return padding


def field_padding(layout, key):
    return padding_of(layout.padding, key, layout.structure)


def array_bytes(layout, example):
    """``(the bytes of the arrays of example, the room for them in
    layout)``, as ``shared_mem`` counts (the rows of its other values,
    a label, left out); None when ``example`` does not have the
    layout's structure."""
    if layout.structure != ('tuple' if isinstance(example, tuple) else
                            'dict' if isinstance(example, dict) else
                            'single'):
        return None
    try:
        arrays = _array_fields(layout, example)
    except (IndexError, KeyError, TypeError):
        return None
    return (sum(v.nbytes for _, v in arrays),
            sum(f.row_bytes for f, _ in arrays))


def _array_fields(layout, example):
    """``(field, value)`` for each field of ``layout`` whose value in
    ``example`` is an array (what ``shared_mem`` counts)."""
    values = [example if f.key is None else example[f.key]
              for f in layout.fields]
    return [(f, v) for f, v in zip(layout.fields, values)
            if isinstance(v, numpy.ndarray)]


def row_bytes(layout):
    """Bytes one example takes in a stacked layout."""
    return sum(field.row_bytes for field in layout.fields)


def padded_fields(layout):
    """Indices of the fields whose shape may vary (padding given)."""
    return layout.padded


class Rows(typing.NamedTuple):
    """A chunk of ``n`` examples all written into their rows; ``tops``
    maps each padded field to the largest shape in the chunk (the rest of
    each row holds the padding value up to that shape); ``specs`` gives,
    per field without padding, the ``(dtype str, shape, kinds)`` of every
    row of the chunk, ``kinds`` the ``kind_of`` the values: one letter
    when all are alike, else one per example (None for padded fields,
    whose values are arrays; ``specs`` None: the layout's own ``dtype``
    and ``capacity``, arrays)."""
    n: int
    tops: dict
    specs: tuple = None
    # ``Layout.exact`` (list batches): per padded field, each example's
    # shape, for the parent to cut its row to; else None.
    shapes: dict = None


def example_columns(layout, examples):
    """The field values of the examples, field by field, or None when an
    example does not have the layout's structure."""
    if layout.structure == 'tuple':
        # set(map(...)) runs in C: far cheaper per example than all(...).
        if set(map(type, examples)) != {tuple} or \
                set(map(len, examples)) != {len(layout.fields)}:
            return None
        return list(zip(*examples))
    if layout.structure == 'dict':
        # The keys in the rows' order, as each example read back from the
        # rows has them, and as concat_examples orders the stacked dict
        # (the first example's).
        keys = tuple(f.key for f in layout.fields)
        if set(map(type, examples)) != {dict} or \
                set(map(tuple, examples)) != {keys}:
            return None
        return [[e[k] for e in examples] for k in keys]
    if set(map(type, examples)) != {numpy.ndarray} and any(
            isinstance(e, (tuple, dict)) for e in examples):
        return None
    return [examples]
