"""Writing examples into the rows of a stacked slot, and reading them
back."""

import operator

import numpy

from chainiter.dataset.stacked_examples import StackedExamples

from chainiter.iterators.multiprocess.layout import Whole
from chainiter.iterators.multiprocess.stacked_layout import (
    ARRAY, NUMPY_SCALAR, PYTHON_SCALAR, Rows, example_columns, field_padding,
    native_dtype, kind_of, padded_fields, pads, restored, row_spec, spec_bytes)

_ndim = operator.attrgetter('ndim')
_dtype = operator.attrgetter('dtype')
_shape = operator.attrgetter('shape')
# Rows up to this size are gathered with one bytes.join (a temporary copy
# that larger rows would pay for in page faults).
_JOIN_BYTES = 4096
# The field dtype numpy.asarray gives a list of these Python numbers.
_PLAIN = {numpy.dtype(int).str: int, numpy.dtype(float).str: float}
# The dtypes numpy makes of a Python float and bool.
_FLOAT = numpy.dtype(float)
_BOOL = numpy.dtype(bool)
# Values of one of these types (all of the same) have one dtype.
_SCALARS = (numpy.generic, bool, int, float, complex)
# The kinds of value _write_like takes.
_LIKE = (ARRAY, NUMPY_SCALAR, PYTHON_SCALAR)
# The kinds of value that have a shape.
_ANY_SHAPE = frozenset((ARRAY, NUMPY_SCALAR))
# The types of value that come back from their rows as they were.
_EXACT = frozenset((numpy.ndarray, bool, int, float, complex))


def write_stacked_chunk(whole, layout, start_row, examples):
    """Write a chunk of examples into rows ``start_row...``.

    Returns ``Rows``, or None when an example does not fit (then write
    them one by one).  It costs a few numpy calls per field, not per
    example.
    """
    n = len(examples)
    columns = example_columns(layout, examples)
    if columns is None or (layout.exact and not exact_columns(columns)):
        return None
    padded = set(padded_fields(layout))
    tops = {}
    specs = []
    shapes = {} if layout.exact and padded else None
    for i, (field, column) in enumerate(zip(layout.fields, columns)):
        start = field.offset + start_row * field.row_bytes
        first = column[0]
        if i not in padded:
            # The rows take the dtype and shape of the chunk's first
            # example, when they fit; every other example must have them.
            spec = row_spec(first)
            if spec is None or spec_bytes(spec) > field.row_bytes:
                return None
            # The values are all of one kind, the first's (each branch
            # checks): the rows tell the parent which (Rows.specs), should
            # it have to stack the batch itself.
            dtype, capacity = spec
            specs.append((dtype.str, capacity, kind_of(first)))
            size = spec_bytes(spec)
            dst = whole[start:start + n * size].view(dtype).reshape(
                (n,) + capacity)
            try:
                if type(first) is numpy.ndarray and \
                        size <= _JOIN_BYTES:
                    # Arrays of exactly the field's dtype and shape: one
                    # copy of all their bytes is far cheaper per example
                    # than concatenate or stack.  (Numpy scalars, of
                    # shape () too, are of another kind.)
                    if set(map(_shape, column)) != {capacity} or (
                            not capacity and
                            set(map(type, column)) != {numpy.ndarray}):
                        raise ValueError(capacity)
                    dtypes = set(map(_dtype, column))
                    if dtypes != {dst.dtype}:
                        # numpy.stack gives native byte order: arrays of
                        # the other order are swapped, never mixed.  With
                        # padding concat_examples keeps the first's order.
                        native = {native_dtype(d) for d in dtypes}
                        if native != {dst.dtype} or field_padding(
                                layout, field.key) is not None:
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
                    if set(map(_ndim, column)) != {len(capacity)} or \
                            set(map(len, column)) != {capacity[0]}:
                        raise ValueError(capacity)
                    numpy.concatenate(
                        column, out=dst.reshape((-1,) + capacity[1:]),
                        casting='no')
                elif set(map(type, column)) == {_PLAIN.get(dtype.str)}:
                    dst[...] = column   # Python ints or floats, unconverted
                else:
                    # Values of several types (numpy.int32 beside
                    # numpy.int64, a float beside an int), or lists,
                    # whose items may differ in type from example to
                    # example, promote one another here as concat_examples
                    # promotes a batch; but a chunk may hold several
                    # batches (a group of them), each with its own
                    # dtype: those go one by one, each example checked.
                    # So do scalars of one type and another dtype (Python
                    # ints beyond int64: uint64 or float64 to numpy).
                    types = set(map(type, column))
                    if len(types) != 1 or not issubclass(
                            types.pop(), _SCALARS):
                        raise TypeError(types)
                    values = numpy.asarray(column)
                    if values.dtype != dtype or \
                            values.shape != dst.shape:
                        raise TypeError(values.dtype)
                    dst[...] = values
            except (AttributeError, OverflowError, TypeError, ValueError):
                return None
            continue
        specs.append(None)
        dst = whole[start:start + n * field.row_bytes].view(
            field.dtype).reshape((n,) + field.capacity)
        pad = field_padding(layout, field.key)
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
            if shapes is not None:
                shapes[i] = [(length,) for length in lengths]
            continue
        top = None
        if shapes is not None:
            shapes[i] = list(map(_shape, column))
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
    return Rows(n, tops, tuple(specs), shapes)


def exact_columns(columns):
    """Whether every value of ``columns`` comes back from its row as it
    was (``restored``): an ndarray of native byte order, a numpy scalar,
    or a Python bool, int, float or complex.  Not a list (it would come
    back a list of another type, or a tuple as a list), an int subclass
    (an enum) or an array of the other byte order."""
    for column in columns:
        types = set(map(type, column))
        if numpy.ndarray in types and not all(
                d.isnative for d in set(map(_dtype, column))):
            return False
        if not types <= _EXACT and not all(
                issubclass(t, numpy.generic) for t in types - _EXACT):
            return False
    return True


def exact_examples(examples):
    """Whether every example of a batch would come back from stacked
    rows as it was (``Layout.exact``): tuples of one length, dicts of
    the same keys, or bare values, of the types ``exact_columns``
    takes."""
    types = set(map(type, examples))
    if types == {tuple}:
        if len(set(map(len, examples))) != 1:
            return False
        columns = list(zip(*examples))
    elif types == {dict}:
        keys = examples[0].keys()
        if any(example.keys() != keys for example in examples):
            return False
        columns = [[example[key] for example in examples] for key in keys]
    elif any(isinstance(example, (tuple, dict)) for example in examples):
        return False
    else:
        columns = [examples]
    return exact_columns(columns)


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
    return Rows(len(metas), _tops(padded, list(shapes.values())),
                tuple(specs), shapes if layout.exact else None)


def _tops(indices, shape_lists):
    tops = {}
    for i, shapes in zip(indices, shape_lists):
        top = None
        for shape in shapes:
            top = shape if top is None else tuple(map(max, top, shape))
        tops[i] = top
    return tops


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
        if not isinstance(example, dict) or example.keys() != {
                f.key for f in layout.fields}:
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


def example_specs(layout, metas):
    """Per example: ``(chunk's first row, its fields' (dtype str, shape,
    kind))``, or the ``Whole`` it came as; from the chunks' results
    (``Rows`` or per-example lists).  For an example of ``Rows`` a padded
    field's shape is the chunk's largest: cut there, its row still holds
    the example followed by padding, which ``concat_examples`` with that
    padding turns into the same batch."""
    out = []
    start = 0
    for meta in metas:
        if type(meta) is not Rows:
            out.extend(m if type(m) is Whole else (start, m) for m in meta)
            start += len(meta)
            continue
        specs = tuple(
            (field.dtype, meta.tops.get(i) or field.capacity, ARRAY)
            if spec is None else spec
            for i, (field, spec) in enumerate(zip(layout.fields,
                                                  _specs(layout, meta))))
        if meta.shapes:
            # Each example's own shape of the padded fields (list
            # batches: each example comes back as it was).
            out.extend((start, tuple(
                spec[:1] + (meta.shapes[i][j],) + spec[2:]
                if i in meta.shapes else
                spec if len(spec[2]) == 1 else spec[:2] + (spec[2][j],)
                for i, spec in enumerate(specs))) for j in range(meta.n))
        elif all(len(spec[2]) == 1 for spec in specs):
            out.extend([(start, specs)] * meta.n)
        else:       # values of several kinds: each example its own
            out.extend((start, tuple(
                spec if len(spec[2]) == 1 else spec[:2] + (spec[2][j],)
                for spec in specs)) for j in range(meta.n))
        start += meta.n
    return out


def _specs(layout, rows):
    """The specs of a ``Rows``, the layout's own when it gives none."""
    if rows.specs is not None:
        return rows.specs
    padded = padded_fields(layout)
    return tuple(None if i in padded else (f.dtype, f.capacity, ARRAY)
                 for i, f in enumerate(layout.fields))


def one_array(layout, chunks):
    """The specs of a batch whose chunks (all ``Rows``) make one array per
    field of the slot, or None: the chunks' rows differ in dtype or shape,
    or lie apart (chunks after the first start at their first row's
    ``row_bytes``: rows smaller than that leave a gap), or
    ``concat_examples`` would fail to pad them (``pads``)."""
    specs = _specs(layout, chunks[0])
    if len(chunks) > 1:
        kinds = [spec and set(spec[2]) for spec in specs]
        for chunk in chunks[1:]:
            other = _specs(layout, chunk)
            if other != specs:
                if [s and s[:2] for s in other] != [
                        s and s[:2] for s in specs]:
                    return None
                for i, spec in enumerate(other):
                    if spec is not None:
                        kinds[i].update(spec[2])
        for field, spec in zip(layout.fields, specs):
            if spec is not None and spec_bytes(spec) != field.row_bytes:
                return None
    else:
        kinds = [spec and spec[2] for spec in specs]
    # concat_examples stacks a field with numpy.asarray, or, when its
    # first value is an array, with numpy.stack (which takes numpy scalars
    # too, not Python ones nor lists) or numpy.full with the padding.
    for field, spec, kind in zip(layout.fields, specs, kinds):
        if spec is None or ARRAY not in kind:
            continue
        if not _ANY_SHAPE.issuperset(kind) or (
                layout.padding is not None and not pads(
                    field_padding(layout, field.key), spec[0])):
            return None
    return specs


def tops_of(layout, metas):
    """The largest shape of each padded field over chunks of ``Rows``."""
    return _tops(padded_fields(layout),
                 [[m.tops[i] for m in metas] for i in padded_fields(layout)])


def cut_to(stacked, layout, tops):
    """``stacked`` (rows read with larger tops) with each padded field cut
    to ``tops``."""
    values = list(stacked) if layout.structure == 'tuple' else \
        [stacked[f.key] for f in layout.fields] \
        if layout.structure == 'dict' else [stacked]
    for i, top in tops.items():
        if top is not None:
            values[i] = values[i][(slice(None),) + tuple(
                slice(t) for t in top)]
    return _structured(layout, values)


def read_stacked(base, layout, n, tops, specs):
    """The stacked batch of ``n`` rows as views of ``base`` (the slot's
    bytes); ``tops`` gives the batch's largest shape of padded fields and
    ``specs`` the rows' dtype and shape of the others."""
    out = []
    for i, (field, spec) in enumerate(zip(layout.fields, specs)):
        if spec is not None:
            out.append(numpy.ndarray((n,) + spec[1], spec[0], base,
                                     field.offset))
            continue
        rows = numpy.ndarray((n,) + field.capacity, field.dtype, base,
                             field.offset)
        top = tops.get(i)
        if top is not None and top != field.capacity:
            rows = rows[(slice(None),) + tuple(slice(t) for t in top)]
        out.append(rows)
    return _structured(layout, out)


def _structured(layout, values):
    if layout.structure == 'tuple':
        return tuple(values)
    if layout.structure == 'dict':
        return {field.key: v for field, v in zip(layout.fields, values)}
    return values[0]


def read_example(base, layout, start_row, row, specs):
    """Example ``row`` of a stacked slot (in a chunk from row
    ``start_row``), for the rare batch that has to be converted in the
    parent: each field cut to its ``(dtype str, shape, kind)`` in
    ``specs``, an array as a view, a scalar or a list as one again
    (``restored``), so that the converter gets what it would have got
    without the slot."""
    padded = padded_fields(layout)
    values = []
    for i, (field, (dtype, shape, kind)) in enumerate(zip(layout.fields,
                                                          specs)):
        if i in padded:
            full = numpy.ndarray(field.capacity, field.dtype, base,
                                 field.offset + row * field.row_bytes)
            values.append(full[tuple(slice(d) for d in shape)])
        else:
            size = spec_bytes((dtype, shape))
            values.append(restored(numpy.ndarray(
                shape, dtype, base, field.offset +
                start_row * field.row_bytes + (row - start_row) * size),
                kind))
    return _structured(layout, values)


def listed_kinds(layout, chunks):
    """The kind of value of each field (``kind_of``), when every example
    of the chunks (all ``Rows``) has the same; else None."""
    kinds = None
    for chunk in chunks:
        specs = _specs(layout, chunk)
        if specs and (chunk.shapes or {}).keys() != set(layout.padded):
            return None
        these = tuple(ARRAY if spec is None else spec[2] for spec in specs)
        if None in these or any(len(k) != 1 for k in these) or \
                kinds is not None and these != kinds:
            return None
        kinds = these
    return kinds


def example_list(stacked, layout, kinds, chunks):
    """The examples of the stacked batch ``stacked`` (read with
    ``Layout.exact`` from ``chunks``, all ``Rows``) as they were loaded,
    a ``StackedExamples``: each array a view of its row (cut to its
    shape, in a padded field), each scalar of its type again."""
    values = list(stacked) if layout.structure == 'tuple' else \
        [stacked[f.key] for f in layout.fields] \
        if layout.structure == 'dict' else [stacked]
    columns = []
    for i, (value, kind) in enumerate(zip(values, kinds)):
        if i in layout.padded:
            shapes = [shape for chunk in chunks for shape in chunk.shapes[i]]
            if len(value.shape) == 2:
                columns.append([row[:shape[0]] for row, shape in
                                zip(value, shapes)])
            else:
                columns.append([row[tuple(map(slice, shape))] for row, shape
                                in zip(value, shapes)])
        elif kind == PYTHON_SCALAR:
            columns.append(value.tolist())
        elif kind == ARRAY and value.ndim == 1:
            # 0-d arrays: iterating would give numpy scalars.
            columns.append([value[i, ...] for i in range(len(value))])
        else:
            columns.append(list(value))
    padding = layout.padding if layout.padded else None
    if layout.structure == 'tuple':
        return StackedExamples(zip(*columns), stacked, padding)
    if layout.structure == 'dict':
        keys = [f.key for f in layout.fields]
        return StackedExamples(
            [dict(zip(keys, example)) for example in zip(*columns)],
            stacked, padding, dict(zip(keys, columns)))
    return StackedExamples(columns[0], stacked, padding)
