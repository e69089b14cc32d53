"""Writing a columnar chunk (``chainiter.datasets._columns.Columns``, what
``TupleDataset.get_examples`` and ``DictDataset.get_examples`` return)
into the rows of a stacked slot, a field at a time, without building the
examples.

An array field whose dtype and row shape are exactly the layout's is
taken from the dataset straight into its rows (``numpy.take(...,
out=rows)``: one copy).  Any other field (a list of Python ints, another
byte order, a padded field) is written from its column of values by
``write_stacked_chunk`` itself, through a layout of that one field: the
same rules as ``concat_examples``.  When a field does not fit, the caller
writes the examples one by one (nothing is ever cut).
"""

from chainiter.datasets._columns import Columns
from chainiter.iterators.pipeline.memory.row_values import (
    ARRAY, NUMPY_SCALAR, spec_bytes)
from chainiter.iterators.pipeline.memory.stacked_layout import (
    Rows, field_padding)
from chainiter.iterators.pipeline.memory.stacked_rows import write_stacked_chunk


def is_columns(examples):
    return type(examples) is Columns


def write_stacked_columns(whole, layout, start_row, columns):
    """Write ``columns`` into rows ``start_row...``; ``Rows``, or None
    when it does not fit the layout (then write the examples one by
    one)."""
    if layout.structure != columns.structure or \
            len(layout.fields) != len(columns.keys):
        return None
    place = {key: k for k, key in enumerate(columns.keys)}
    n = len(columns)
    tops = {}
    specs = []
    shapes = {} if layout.exact and layout.padded else None
    for i, field in enumerate(layout.fields):
        k = place.get(field.key)
        if k is None:
            return None
        padded = i in layout.padded
        dataset = columns.datasets[k]
        dtype = getattr(dataset, 'dtype', None)
        start = field.offset + start_row * field.row_bytes
        if dtype is not None and dtype.isnative and dtype.kind in 'biufc':
            # The rows of a field without padding take the column's dtype
            # and shape when they fit its bytes (as write_stacked_chunk
            # does); a padded field's rows are exactly the layout's.  The
            # values are the dataset's rows: numpy scalars of a 1-d one.
            shape = tuple(dataset.shape[1:])
            spec = (dtype.str, shape, ARRAY if shape else NUMPY_SCALAR)
            size = spec_bytes(spec)
            fits = spec[:2] == (field.dtype, field.capacity) if padded \
                else size <= field.row_bytes
            if fits:
                rows = whole[start:start + n * size].view(dtype).reshape(
                    (n,) + shape)
                if columns.take(k, rows):
                    if padded:
                        tops[i] = field.capacity
                        if shapes is not None:
                            shapes[i] = [field.capacity] * n
                    specs.append(None if padded else spec)
                    continue
        one = layout._replace(structure='single', fields=(field,),
                              padded=(0,) if padded else (),
                              padding=field_padding(layout, field.key))
        written = write_stacked_chunk(whole, one, start_row, columns.column(k))
        if written is None:
            return None
        if padded:
            tops[i] = written.tops[0]
            if shapes is not None:
                shapes[i] = written.shapes[0]
        specs.append(written.specs[0])
    return Rows(n, tops, tuple(specs), shapes)
