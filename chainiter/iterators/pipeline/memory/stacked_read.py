"""Reading stacked rows back: the specs of each example and of a batch
(``example_specs``, ``one_array``), the stacked batch as views of the
slot (``read_stacked``, ``cut_to``) and one example of it
(``read_example``).  ``stacked_rows.py`` and ``example_rows.py`` write
the rows."""

import numpy

from chainiter.iterators.pipeline.memory.layout import Whole
from chainiter.iterators.pipeline.memory.row_values import (
    ARRAY, NUMPY_SCALAR, pads, restored, spec_bytes)
from chainiter.iterators.pipeline.memory.stacked_layout import (
    Rows, field_padding, padded_fields)

# The kinds of value that have a shape.
_ANY_SHAPE = frozenset((ARRAY, NUMPY_SCALAR))


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
            for i, (field, spec) in enumerate(zip(
                layout.fields, rows_specs(layout, meta))))
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


def rows_specs(layout, rows):
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
    specs = rows_specs(layout, chunks[0])
    if len(chunks) > 1:
        kinds = [spec and set(spec[2]) for spec in specs]
        for chunk in chunks[1:]:
            other = rows_specs(layout, chunk)
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


def largest_shapes(indices, shape_lists):
    """The largest shape of each field ``indices`` names over its list of
    shapes in ``shape_lists`` (None for an empty list)."""
    tops = {}
    for i, shapes in zip(indices, shape_lists):
        top = None
        for shape in shapes:
            top = shape if top is None else tuple(map(max, top, shape))
        tops[i] = top
    return tops


def tops_of(layout, metas):
    """The largest shape of each padded field over chunks of ``Rows``."""
    return largest_shapes(
        padded_fields(layout),
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


def read_stacked(base, layout, n, tops, specs, start=0):
    """The stacked batch of ``n`` rows from row ``start`` as views of
    ``base`` (the slot's bytes); ``tops`` gives the batch's largest shape
    of padded fields and ``specs`` the rows' dtype and shape of the
    others."""
    out = []
    for i, (field, spec) in enumerate(zip(layout.fields, specs)):
        offset = field.offset + start * field.row_bytes
        if spec is not None:
            out.append(numpy.ndarray((n,) + spec[1], spec[0], base, offset))
            continue
        rows = numpy.ndarray((n,) + field.capacity, field.dtype, base,
                             offset)
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
