"""Reading a whole batch back from its slot."""

import typing

import numpy

from chainiter.iterators.multiprocess.layout import Whole
from chainiter.iterators.multiprocess.list_layout import (
    UniformRows, read_list_chunk, read_list_example)
from chainiter.iterators.multiprocess.stacked_layout import Rows
from chainiter.iterators.multiprocess.stacked_rows import (
    example_specs, one_array, read_example, read_stacked, tops_of)

class _AsIs(typing.NamedTuple):
    """An example already read back from shared memory."""
    example: object


def read_batch(base, layout, chunks):
    """Read a batch from its slot (``base``) and the chunks' results.

    Returns ``(stacked, examples, oversize)``: ``stacked`` is the stacked
    batch when every example went into its rows (stacked layout), else
    None and ``examples`` lists the examples; ``oversize`` lists those that
    came whole because they did not fit.
    """
    if layout.mode == 'stacked':
        if all(type(chunk) is Rows for chunk in chunks):
            specs = one_array(layout, chunks)
            if specs is not None:       # the common case
                n = sum(chunk.n for chunk in chunks)
                tops = chunks[0].tops if len(chunks) == 1 else \
                    tops_of(layout, chunks)
                return read_stacked(base, layout, n, tops, specs), None, ()
        metas = example_specs(layout, chunks)
        # The rows come back as arrays: give the examples that came whole
        # arrays too, so that the converter sees one kind of field (a list
        # beside an array is an error to concat_examples).
        examples = [_as_arrays(m.example, layout) if type(m) is Whole
                    else read_example(base, layout, m[0], row, m[1])
                    for row, m in enumerate(metas)]
    else:
        metas = []
        for chunk in chunks:
            if type(chunk) is UniformRows:
                chunk = [_AsIs(e) for e in read_list_chunk(
                    base, len(metas) * layout.example_bytes, layout, chunk)]
            metas.extend(chunk)
        examples = [
            meta.example if type(meta) in (Whole, _AsIs) else
            read_list_example(base, meta) for meta in metas]
    return None, examples, [m.example for m in metas if type(m) is Whole]


def _as_arrays(example, layout):
    """``example`` with each field as ``numpy.asarray`` makes it, as a row
    of the stacked layout reads back (when it has the layout's structure)."""
    if layout.structure == 'tuple' and type(example) is tuple:
        return tuple(numpy.asarray(value) for value in example)
    if layout.structure == 'dict' and type(example) is dict:
        return {key: numpy.asarray(value) for key, value in example.items()}
    if layout.structure == 'single':
        return numpy.asarray(example)
    return example
