"""Reading a whole batch back from its slot."""

import typing

import numpy

from chainiter.iterators.pipeline.memory.layout import Whole
from chainiter.iterators.pipeline.memory.list_layout import (
    UniformRows, read_list_chunk, read_list_example)
from chainiter.iterators.pipeline.memory.exact_rows import (
    example_list, listed_kinds)
from chainiter.iterators.pipeline.memory.stacked_layout import Rows
from chainiter.iterators.pipeline.memory.stacked_read import (
    example_specs, one_array, read_example, read_stacked, tops_of)


class _AsIs(typing.NamedTuple):
    """An example already read back from shared memory."""
    example: object


class Apart:
    """A group's batches read each as its own stacked batch (``batches``,
    in order): they are of several shapes or dtypes (bucketed data), so
    they do not stack as one array."""
    __slots__ = ('batches',)

    def __init__(self, batches):
        self.batches = batches


def stacked_arrays(stacked):
    """The arrays of a stacked batch (a dict, a tuple or one array), as a
    list; None for anything else."""
    if type(stacked) is dict:
        return list(stacked.values())
    if type(stacked) is tuple:
        return list(stacked)
    if type(stacked) is numpy.ndarray:
        return [stacked]
    return None


def read_batch(base, layout, chunks, cuts=()):
    """Read a batch from its slot (``base``) and the chunks' results;
    ``cuts``: where each batch of a group written apart begins (``Task``).

    Returns ``(stacked, examples, oversize)``: ``stacked`` is the stacked
    batch when every example went into its rows (stacked layout), or an
    ``Apart`` of a group's batches, else None and ``examples`` lists the
    examples; ``oversize`` lists those that came whole because they did
    not fit.
    """
    if layout.mode == 'stacked':
        if all(type(chunk) is Rows for chunk in chunks):
            specs = one_array(layout, chunks)
            if specs is None and cuts:
                apart = _read_apart(base, layout, chunks, cuts)
                if apart is not None:
                    return apart, None, ()
            if specs is not None:       # the common case
                n = sum(chunk.n for chunk in chunks)
                tops = chunks[0].tops if len(chunks) == 1 else \
                    tops_of(layout, chunks)
                stacked = read_stacked(base, layout, n, tops, specs)
                if not layout.exact:
                    return stacked, None, ()
                kinds = listed_kinds(layout, chunks)
                if kinds is not None:
                    return (example_list(stacked, layout, kinds, chunks),
                            None, ())
        metas = example_specs(layout, chunks)
        # The rows come back as the values they were written from, and
        # the examples that came whole as they are: the converter makes
        # of them what it would have made of the examples loaded.
        examples = [m.example if type(m) is Whole
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


def _read_apart(base, layout, chunks, cuts):
    """The ``Apart`` batches of a group whose parts (``chunks``, all
    ``Rows``, none straddling two batches) each batch's own rows hold,
    or None when a batch's rows do not make one array per field."""
    bounds = list(cuts) + [sum(chunk.n for chunk in chunks)]
    batches = []
    parts = []
    row = 0
    for chunk in chunks:
        parts.append(chunk)
        row += chunk.n
        if row < bounds[len(batches) + 1]:
            continue
        start = bounds[len(batches)]
        specs = one_array(layout, parts)
        if specs is None or row != bounds[len(batches) + 1]:
            return None
        tops = parts[0].tops if len(parts) == 1 else \
            tops_of(layout, parts)
        stacked = read_stacked(base, layout, row - start, tops, specs,
                               start)
        if layout.exact:
            kinds = listed_kinds(layout, parts)
            if kinds is None:
                return None
            stacked = example_list(stacked, layout, kinds, parts)
        batches.append(stacked)
        parts = []
    return Apart(batches)
