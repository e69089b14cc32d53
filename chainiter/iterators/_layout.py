"""Where the arrays of a batch go in a shared-memory slot.

Two layouts, both measured from the first batch:

- ``list``: every example gets a region of ``example_bytes``; the arrays of
  its top-level fields are written one after another (64-byte aligned) and
  the worker sends back the example with each array replaced by a
  ``ShmRef(offset, shape, dtype)``.  The parent hands out views.
- ``stacked`` (``converter=concat_examples``): every field of the batch is
  one array of shape ``(batch_size,) + capacity`` in the slot; worker ``w``
  writes example ``j`` straight into row ``j`` (padding included), so the
  parent hands out ``concat_examples``' result without copying.

An example that does not fit (too large, another dtype or structure) is
sent back whole through the pipe instead; the parent then builds that batch
the ordinary way, so nothing is ever truncated.
"""

import operator
import typing

import numpy

from chainiter.dataset.convert import concat_examples

_ALIGN = 64


def _align(n):
    return -(-n // _ALIGN) * _ALIGN


class ShmRef(typing.NamedTuple):
    """An array that was written into shared memory."""
    offset: int
    nbytes: int
    shape: tuple
    dtype: numpy.dtype


class Whole(typing.NamedTuple):
    """An example sent through the pipe: it has no slot or did not fit."""
    example: object


class Field(typing.NamedTuple):
    key: object          # tuple position, dict key, or None for bare examples
    dtype: str
    capacity: tuple      # largest shape the slot holds for one example
    offset: int          # where the field's rows start in a slot
    row_bytes: int


class Layout(typing.NamedTuple):
    mode: str                    # 'list' or 'stacked'
    slot_bytes: int
    example_bytes: int = 0       # list mode
    structure: str = ''          # stacked mode: 'tuple', 'dict' or 'single'
    fields: tuple = ()           # stacked mode
    padding: object = None       # stacked mode: the value, tuple or dict
    padded: tuple = ()           # stacked mode: indices of padded fields


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
    return sum(_align(value.nbytes) for _, value in _fields_of(example)
               if _in_shm(value))


def list_layout(batch_size, example_bytes):
    example_bytes = _align(example_bytes)
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
        offset += _align(n)
        return ref

    if type(example) is tuple:
        return tuple(put(value) for value in example)
    if type(example) is dict:
        return {key: put(value) for key, value in example.items()}
    return put(example)


def read_list_example(base, slot_start, meta):
    """Rebuild an example from ``write_list_example``'s result, its arrays
    viewing ``base`` (the slot's bytes, which start at ``slot_start``)."""
    def get(value):
        if type(value) is not ShmRef:
            return value
        start = value.offset - slot_start
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
        offset += _align(value.nbytes)
    ends = [offset] * n
    ragged = []
    for key, column in varying:
        places = []
        for row, value in enumerate(column):
            places.append((ends[row], value.nbytes, value.shape))
            ends[row] += _align(value.nbytes)
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
        pad = padding[key] if isinstance(padding, (tuple, dict)) else padding
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


def _field_padding(layout, key):
    padding = layout.padding
    if isinstance(padding, (tuple, dict)):
        return padding[key]
    return padding


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


_ndim = operator.attrgetter('ndim')
_dtype = operator.attrgetter('dtype')
_shape = operator.attrgetter('shape')
# Rows up to this size are gathered with one bytes.join (a temporary copy
# that larger rows would pay for in page faults).
_JOIN_BYTES = 4096
# The field dtype numpy.asarray gives a list of these Python numbers.
_PLAIN = {numpy.dtype(int).str: int, numpy.dtype(float).str: float}


def write_stacked_chunk(whole, slot_start, layout, start_row, examples):
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
        start = slot_start + field.offset + start_row * field.row_bytes
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


def row_bytes(layout):
    """Bytes one example takes in a stacked layout."""
    return sum(field.row_bytes for field in layout.fields)


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


def write_stacked_example(whole, slot_start, layout, row, example):
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
        start = slot_start + field.offset + row * field.row_bytes
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


# ---- reading a whole batch back ---------------------------------------------

class _AsIs(typing.NamedTuple):
    """An example already read back from shared memory."""
    example: object


def read_batch(base, slot_start, layout, chunks):
    """Read a batch from its slot (``base``, which starts at byte
    ``slot_start`` of the buffer) and the chunks' results.

    Returns ``(stacked, examples, oversize)``: ``stacked`` is the stacked
    batch when every example went into its rows (stacked layout), else
    None and ``examples`` lists the examples; ``oversize`` lists those that
    came whole because they did not fit.
    """
    if layout.mode == 'stacked':
        if len(chunks) == 1 and type(chunks[0]) is Rows:   # the common case
            return read_stacked(base, layout, chunks[0].n,
                                chunks[0].tops), None, ()
        if all(type(chunk) is Rows for chunk in chunks):
            return read_stacked(base, layout, sum(c.n for c in chunks),
                                tops_of(layout, chunks)), None, ()
        metas = example_shapes(layout, chunks)
        capacity = tuple(f.capacity for f in layout.fields)
        rows = unstack(base, layout, [
            capacity if type(m) is Whole else m for m in metas])
        examples = [m.example if type(m) is Whole else row
                    for m, row in zip(metas, rows)]
    else:
        metas = []
        for chunk in chunks:
            if type(chunk) is UniformRows:
                chunk = [_AsIs(e) for e in read_list_chunk(
                    base, len(metas) * layout.example_bytes, layout, chunk)]
            metas.extend(chunk)
        examples = [
            meta.example if type(meta) in (Whole, _AsIs) else
            read_list_example(base, slot_start, meta) for meta in metas]
    return None, examples, [m.example for m in metas if type(m) is Whole]
