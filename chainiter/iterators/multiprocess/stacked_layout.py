"""The stacked layout, measured from a batch: every field of the batch is
one array of shape ``(batch_size,) + capacity`` in the slot."""

import typing

import numpy

from chainiter.dataset.convert import concat_examples
from chainiter.iterators.multiprocess.layout import Field, Layout, _align

# ---- the stacked layout --------------------------------------------------

def stacked_layout(batch, batch_size, padding, capacities=None):
    """The stacked layout for batches like ``batch``, or None when
    ``concat_examples`` would not give numeric arrays for it.

    ``capacities`` (per field) raise the measured shapes, to grow a layout.
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
        pad = padding_of(padding, key)
        if pad is not None and capacities is not None and key in capacities:
            capacity = tuple(max(a, b)
                             for a, b in zip(capacity, capacities[key]))
        row_bytes = int(numpy.prod(capacity, dtype=numpy.int64)) * \
            array.dtype.itemsize
        if pad is not None and capacity:
            padded.append(len(fields))
        fields.append(Field(key, array.dtype.str, capacity, offset,
                            row_bytes))
        offset += _align(row_bytes * batch_size)
    return Layout('stacked', offset, structure=structure,
                  fields=tuple(fields), padding=padding, padded=tuple(padded))


def mismatch(old, new):
    """How the stacked layout ``new`` (measured from a later batch) differs
    from ``old`` in anything but the room of padded fields, or None."""
    if old.structure != new.structure or \
            [f.key for f in old.fields] != [f.key for f in new.fields]:
        return 'the structure of the examples'
    for i, (a, b) in enumerate(zip(old.fields, new.fields)):
        name = 'the field' if a.key is None else 'field {!r}'.format(a.key)
        if a.dtype != b.dtype:
            return '{}: dtype {} where the first batch had {}'.format(
                name, numpy.dtype(b.dtype), numpy.dtype(a.dtype))
        if len(a.capacity) != len(b.capacity) or (
                i not in old.padded and a.capacity != b.capacity):
            return '{}: shape {} where the first batch had {}'.format(
                name, b.capacity, a.capacity)
    return None


def widen(layout, batch, batch_size, example_bytes):
    """``layout`` with its padded fields lengthened (along their first
    dimension, all by the same factor) so that one example's row takes at
    least ``example_bytes``; ``layout`` itself when it already does or has
    no padded field."""
    padded = [layout.fields[i] for i in padded_fields(layout)]
    have = row_bytes(layout)
    if have >= example_bytes or not padded:
        return layout
    padded_bytes = sum(f.row_bytes for f in padded)
    factor = (example_bytes - (have - padded_bytes)) / max(padded_bytes, 1)
    capacities = {f.key: (int(numpy.ceil(f.capacity[0] * factor)),) +
                  f.capacity[1:] for f in padded}
    return stacked_layout(batch, batch_size, layout.padding, capacities)


def padding_of(padding, key):
    """The padding of field ``key``, as ``concat_examples`` reads
    ``padding``: a value for every field, a tuple with one per field, or a
    dict naming some keys (the others unpadded)."""
    if isinstance(padding, dict):
        return padding.get(key)
    if isinstance(padding, tuple):
        return padding[key]
    return padding


def _field_padding(layout, key):
    return padding_of(layout.padding, key)


def row_bytes(layout):
    """Bytes one example takes in a stacked layout."""
    return sum(field.row_bytes for field in layout.fields)


def padded_fields(layout):
    """Indices of the fields whose shape may vary (padding given)."""
    return layout.padded


class Rows(typing.NamedTuple):
    """A chunk of ``n`` examples all written into their rows; ``tops``
    maps each padded field to the largest shape in the chunk (the rest of
    each row holds the padding value up to that shape)."""
    n: int
    tops: dict


def _columns(layout, examples):
    """The field values of the examples, field by field, or None when an
    example does not have the layout's structure."""
    if layout.structure == 'tuple':
        # set(map(...)) runs in C: far cheaper per example than all(...).
        if set(map(type, examples)) != {tuple} or \
                set(map(len, examples)) != {len(layout.fields)}:
            return None
        return list(zip(*examples))
    if layout.structure == 'dict':
        keys = [f.key for f in layout.fields]
        if set(map(type, examples)) != {dict} or \
                set(map(len, examples)) != {len(keys)}:
            return None
        try:
            return [[e[k] for e in examples] for k in keys]
        except KeyError:
            return None
    if set(map(type, examples)) != {numpy.ndarray} and any(
            isinstance(e, (tuple, dict)) for e in examples):
        return None
    return [examples]


def _native(dtype):
    return dtype.newbyteorder('=') if dtype.byteorder in '<>' else dtype

