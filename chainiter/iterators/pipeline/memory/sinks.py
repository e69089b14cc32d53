"""Where a worker puts the examples of a task as it loads them: into the
task's slot (one by one, or a chunk at a time) or, without a slot, into the
result itself.

A sink takes the examples one by one (``append``) or, from a dataset's
batch method, all at once (``extend``); a stacked sink writes the columns
of ``TupleDataset``/``DictDataset.get_examples`` straight into its rows."""

import numpy

from chainiter.iterators.pipeline.memory import (
    example_rows, layout as _layout, list_layout, stacked_columns, stacked_layout, stacked_rows)

# Examples of at least this many bytes are written into shared memory as
# soon as each is loaded: its memory is then freed and reused by the next,
# instead of a whole chunk of fresh allocations that page-fault.  Smaller
# ones are stacked a chunk at a time, with a few numpy calls per field.
_STREAM_BYTES = 16384


class _WholeSink(list):
    """No slot: every example goes through the pipe."""

    def result(self):
        return [_layout.Whole(example) for example in self]


class _EachSink:
    """Writes each example into the slot as soon as it is loaded."""

    def __init__(self, whole, layout, row):
        self.whole, self.layout = whole, layout
        self.row = row
        self.metas = []

    def append(self, example):
        meta = self.write(example)
        self.metas.append(_layout.Whole(example) if meta is None else meta)
        self.row += 1

    def __len__(self):
        return len(self.metas)

    def extend(self, examples):
        for example in examples:
            self.append(example)


class _ListSink(_EachSink):

    def write(self, example):
        return list_layout.write_list_example(
            self.whole, self.row * self.layout.example_bytes,
            self.layout, example)

    def result(self):
        return self.metas


class _TakesColumns:
    """Mixed into a stacked sink: a batch method's columns (the whole
    chunk at once) go straight into the rows; anything else goes to the
    base class."""
    rows = None     # the Rows of a chunk written a column at a time

    def extend(self, examples):
        if not len(self) and self.rows is None and \
                stacked_columns.is_columns(examples):
            self.rows = stacked_columns.write_stacked_columns(
                self.whole, self.layout, self.row, examples)
            if self.rows is not None:
                return
        super().extend(examples)


class _StackedSink(_TakesColumns, _EachSink):
    """Rows large enough to stream (``_STREAM_BYTES``); a task whose
    first example is smaller than that (bucketed data: the rows hold
    the longest bucket) is collected and written as a chunk instead, a
    few numpy calls per field: written one by one, examples of 4 KB in
    rows of 32 KB took the workers 40% more time."""

    def __init__(self, whole, layout, row):
        super().__init__(whole, layout, row)
        self.examples = example_rows.ExampleRows(whole, layout, row)
        self.chunk = None   # the examples collected, when small

    def append(self, example):
        if self.chunk is not None:
            self.chunk.append(example)
        elif not self.metas and _array_bytes(example) < _STREAM_BYTES:
            self.chunk = [example]
        else:
            super().append(example)

    def __len__(self):
        return len(self.metas) if self.chunk is None else len(self.chunk)

    def write(self, example):
        return self.examples.write(self.row, example)

    def result(self):
        if self.rows is not None:
            return self.rows
        chunk, self.chunk = self.chunk, None
        if chunk is not None:
            rows = stacked_rows.write_stacked_chunk(
                self.whole, self.layout, self.row, chunk)
            if rows is not None:
                return rows
            for example in chunk:
                super().append(example)
        return example_rows.as_rows(self.layout, self.metas)


def _array_bytes(example):
    """The bytes of the arrays of an example (a tuple, a dict or one
    value)."""
    values = example if type(example) is tuple else \
        example.values() if type(example) is dict else (example,)
    return sum(value.nbytes for value in values
               if type(value) is numpy.ndarray)


class _ChunkSink(list):
    """Collects the (small) examples of a task, then writes them all with a
    few numpy calls per field."""

    def __init__(self, whole, layout, row):
        super().__init__()
        self.whole, self.layout = whole, layout
        self.row = row

    def _one_by_one(self, sink_type):
        sink = sink_type(self.whole, self.layout, self.row)
        for example in self:
            sink.append(example)
        return sink.result()


class _ListChunkSink(_ChunkSink):

    def result(self):
        if not self:
            return []
        start = self.row * self.layout.example_bytes
        rows = list_layout.write_list_chunk(self.whole, start, self.layout,
                                            self)
        return self._one_by_one(_ListSink) if rows is None else rows


class _StackedChunkSink(_TakesColumns, _ChunkSink):

    def result(self):
        if self.rows is not None:
            return self.rows
        rows = stacked_rows.write_stacked_chunk(
            self.whole, self.layout, self.row, self)
        return self._one_by_one(_StackedSink) if rows is None else rows


def sink_for(whole, layout, row):
    """The sink for a task whose first example is row ``row`` of the slot
    ``whole`` (None: no slot)."""
    if whole is None:
        return _WholeSink()
    if layout.mode == 'list':
        if layout.example_bytes >= _STREAM_BYTES:
            return _ListSink(whole, layout, row)
        return _ListChunkSink(whole, layout, row)
    if stacked_layout.row_bytes(layout) >= _STREAM_BYTES:
        return _StackedSink(whole, layout, row)
    return _StackedChunkSink(whole, layout, row)
