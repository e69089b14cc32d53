"""Stacked layouts that adapt to batches of other shapes and dtypes,
driven without any process: what the buffers become (``SlotPool.fit``),
what a worker writes (``stacked_rows``, ``example_rows``) and what the
parent reads back (``read.read_batch``), in a plain byte array."""

import functools
import types

import numpy
import pytest

from chainiter import concat_examples
from chainiter.iterators.pipeline.memory import read, sinks, stacked_layout
from chainiter.iterators.pipeline.memory.layout import Whole
from chainiter.iterators.pipeline.memory.slots import GROWTH, SlotPool
from chainiter.iterators.pipeline.memory.example_rows import (
    ExampleRows, as_rows, write_stacked_example)
from chainiter.iterators.pipeline.memory.stacked_rows import write_stacked_chunk

import helpers

BATCH = 4


def bucket(length, start=0, dtype=numpy.float32):
    """A batch of (array of shape (length, 8), int label)."""
    return [(numpy.full((length, 8), start + j, dtype=dtype), start + j)
            for j in range(BATCH)]


def slots(padding=None, stacked=True, shared_mem=None):
    return SlotPool(4, BATCH, stacked, padding, shared_mem)


def fitted(pool, batch):
    """Fit ``pool`` to ``batch``; the new layout (now in use) or None."""
    new, how = pool.fit(batch, pool.layout, [])
    assert how is None, how
    if new is not None:
        pool.buffers = type('B', (), {'layout': new})()
    return new


def test_a_longer_bucket_grows_the_rows_and_shorter_ones_fit():
    pool = slots()
    first = fitted(pool, bucket(16))
    assert first.fields[0].row_bytes == 16 * 8 * 4
    grown = fitted(pool, bucket(64))
    assert grown.fields[0].row_bytes == 64 * 8 * 4
    assert fitted(pool, bucket(32)) is None         # it fits already
    assert fitted(pool, bucket(16)) is None
    # A little longer still grows by at least GROWTH: few layouts in all.
    more = fitted(pool, bucket(65))
    assert more.fields[0].row_bytes >= GROWTH * 64 * 8 * 4


def test_a_dtype_change_of_one_field_grows_only_when_it_needs_room():
    pool = slots()
    fitted(pool, bucket(8))
    # float labels take as many bytes as int64 ones: nothing to change.
    assert fitted(pool, [(x, float(t)) for x, t in bucket(8)]) is None
    wider = fitted(pool, bucket(8, dtype=numpy.float64))
    assert wider.fields[0].row_bytes == 8 * 8 * 8
    assert fitted(pool, bucket(8, dtype=numpy.int16)) is None


def test_what_no_growth_holds_is_a_mismatch():
    pool = slots()
    fitted(pool, bucket(8))
    new, how = pool.fit([x for x, _ in bucket(8)], pool.layout, [])
    assert new is None and 'structure' in how
    padded = slots(padding=0)
    fitted(padded, [numpy.arange(j + 1, dtype=numpy.int32)
                    for j in range(BATCH)])
    new, how = padded.fit([numpy.arange(j + 1, dtype=numpy.float64)
                           for j in range(BATCH)], padded.layout, [])
    assert new is None and 'dtype float64' in how


def test_shared_mem_reserves_room_for_fields_without_padding():
    pool = slots(shared_mem=128 * 8 * 4 + 8)
    layout = fitted(pool, bucket(16))
    assert stacked_layout.row_bytes(layout) >= 128 * 8 * 4 + 8
    assert fitted(pool, bucket(128)) is None


def write(layout, chunks, one_by_one=False):
    """The slot's bytes and the chunks' results, as workers make them:
    ``chunks`` lists (start row, examples)."""
    whole = numpy.zeros(layout.slot_bytes, dtype=numpy.uint8)
    results = []
    for start, examples in chunks:
        rows = None if one_by_one else write_stacked_chunk(
            whole, layout, start, examples)
        if rows is None:
            metas = []
            writer = ExampleRows(whole, layout, start)
            for row, example in enumerate(examples, start):
                meta = writer.write(row, example)
                metas.append(Whole(example) if meta is None else meta)
            rows = as_rows(layout, metas)
        results.append(rows)
    return whole, results


def describe(batch):
    return [(a.dtype.str, a.shape, a.tobytes()) for a in batch]


@pytest.mark.parametrize('one_by_one', [False, True],
                         ids=['chunk', 'one-by-one'])
def test_every_bucket_is_one_contiguous_array_of_the_slot(one_by_one):
    pool = slots()
    fitted(pool, bucket(16))
    layout = fitted(pool, bucket(128))
    for length in (16, 32, 64, 128):
        batch = bucket(length, start=length)
        whole, results = write(layout, [(0, batch)], one_by_one)
        stacked, examples, oversize = read.read_batch(whole, layout,
                                                      results)
        assert examples is None and oversize == ()
        assert describe(stacked) == describe(concat_examples(batch))
        for array in stacked:
            assert array.flags.c_contiguous
            assert array.base is whole or array.base.base is whole


def test_a_batch_split_into_chunks_that_differ_is_converted_alike():
    pool = slots()
    layout = fitted(pool, bucket(8, dtype=numpy.float64))
    # The first chunk's rows are float32, the second's float64: together
    # concat_examples makes them float64.
    batch = bucket(8, dtype=numpy.float32)[:2] + bucket(8, 2)[2:]
    whole, results = write(layout, [(0, batch[:2]), (2, batch[2:])])
    stacked, examples, oversize = read.read_batch(whole, layout, results)
    assert stacked is None and oversize == []
    assert describe(concat_examples(examples)) == describe(
        concat_examples(batch))


def test_chunks_of_rows_shorter_than_the_field_are_read_apart():
    pool = slots()
    fitted(pool, bucket(32))
    layout = pool.layout
    batch = bucket(16, 5)
    whole, results = write(layout, [(0, batch[:2]), (2, batch[2:])])
    stacked, examples, _ = read.read_batch(whole, layout, results)
    assert stacked is None
    assert describe(concat_examples(examples)) == describe(
        concat_examples(batch))
    # Rows that fill the field are one array, however many chunks.
    batch = bucket(32, 7)
    whole, results = write(layout, [(0, batch[:1]), (1, batch[1:])])
    stacked, _, _ = read.read_batch(whole, layout, results)
    assert describe(stacked) == describe(concat_examples(batch))


@pytest.mark.parametrize('exact', [False, True], ids=['stacked', 'list'])
def test_a_group_of_buckets_written_apart_is_read_batch_by_batch(exact):
    # A group's batches of several shapes and dtypes do not stack as one
    # array; written apart (each batch a part from its first row, as a
    # worker writes a task with cuts), each is read as its own, views of
    # the slot.
    pool = SlotPool(4, 3 * BATCH, True, None, None, exact=exact)
    layout = fitted(pool, bucket(128, dtype=numpy.float64))
    batches = [bucket(16, 0), bucket(128, 10, numpy.float64), bucket(32, 20)]
    group = [(k * BATCH, batch) for k, batch in enumerate(batches)]
    whole, results = write(layout, group)
    cuts = tuple(start for start, _ in group)
    stacked, examples, oversize = read.read_batch(whole, layout, results,
                                                  cuts)
    assert type(stacked) is read.Apart and examples is None
    assert oversize == ()
    assert len(stacked.batches) == 3
    for got, batch in zip(stacked.batches, batches):
        if exact:
            assert [describe(x[:1]) + [x[1]] for x in got] == [
                describe(x[:1]) + [x[1]] for x in batch]
            got = concat_examples(got)
        assert describe(got) == describe(concat_examples(batch))
        assert got[0].base is whole or got[0].base.base is whole
    # Without the cuts the group is no one batch: its examples.
    stacked, examples, _ = read.read_batch(whole, layout, results)
    assert stacked is None and len(examples) == 3 * BATCH


@pytest.mark.parametrize('lengths', [(16,) * 4, (1024,) * 4,
                                     (16, 16, 1024, 16)],
                         ids=['small', 'large', 'small-then-large'])
def test_rows_to_stream_take_small_examples_as_a_chunk(lengths):
    # Rows of 32 KB (the longest bucket) stream large examples into the
    # slot as each is loaded, and collect a task of small ones (the
    # shorter buckets) to write as a chunk; a chunk whose examples
    # differ is written one by one.  Every way reads back as the batch.
    pool = slots()
    layout = fitted(pool, bucket(1024))
    assert stacked_layout.row_bytes(layout) >= sinks._STREAM_BYTES
    batch = [(numpy.full((n, 8), j, numpy.float32), j)
             for j, n in enumerate(lengths)]
    whole = numpy.zeros(layout.slot_bytes, dtype=numpy.uint8)
    sink = sinks.sink_for(whole, layout, 0)
    for example in batch:
        sink.append(example)
    assert len(sink) == BATCH
    stacked, examples, _ = read.read_batch(whole, layout, [sink.result()])
    if len(set(lengths)) == 1:
        assert describe(stacked) == describe(concat_examples(batch))
    else:
        assert stacked is None
        assert [describe(e[:1]) + [e[1]] for e in examples] == [
            describe(e[:1]) + [e[1]] for e in batch]


def _ids(i, label):
    return [i, i + 1], label


@pytest.mark.parametrize('padding', [None, 0])
@pytest.mark.parametrize('first,batch', [
    ([_ids(i, i) for i in range(4)],
     [_ids(8, 8), _ids(9, 2.5), _ids(10, 10), _ids(11, 11)]),
    ([_ids(i, i) for i in range(4)],
     [_ids(8, numpy.int32(8)), _ids(9, 9), _ids(10, True), _ids(11, 2**63)]),
    ([numpy.float32(i) for i in range(4)],
     [numpy.float32(1), 2.5, numpy.float64(3), 4]),
    ([numpy.arange(3) + i for i in range(4)],
     [numpy.arange(3), {'a': 1}, (numpy.arange(2), numpy.arange(3)), 4]),
    ([numpy.arange(3) + i for i in range(4)],
     [numpy.arange(3), [1, 2, 3], numpy.arange(3), numpy.arange(3)]),
], ids=['a-float-label', 'scalars-of-all-kinds', 'bare-floats',
        'other-structures', 'a-list-after-an-array'])
def test_a_batch_read_back_converts_as_the_examples_loaded(
        first, batch, padding):
    """Rows that the main process reads back to stack itself are the
    values they were written from (a scalar a scalar again, a list a
    list), and examples that came whole are as they were: the converter
    makes of them what it makes of the examples (or raises as it does),
    never a cast into the layout's dtype."""
    converter = functools.partial(concat_examples, padding=padding)

    def outcome(make):
        try:
            return helpers.describe(make())
        except Exception as e:
            return type(e)
    pool = slots(padding=padding)
    layout = fitted(pool, first)
    for one_by_one in (False, True):
        whole, results = write(layout, [(0, batch[:2]), (2, batch[2:])],
                               one_by_one)
        stacked, examples, _ = read.read_batch(whole, layout, results)
        got = outcome(lambda: converter(examples) if stacked is None
                      else stacked)
        assert got == outcome(lambda: converter(batch)), one_by_one


def test_examples_too_large_for_their_rows_come_whole():
    pool = slots()
    layout = fitted(pool, bucket(8))
    batch = bucket(8)[:2] + bucket(9)[2:]
    whole, results = write(layout, [(0, batch)])
    stacked, examples, oversize = read.read_batch(whole, layout, results)
    assert stacked is None and len(oversize) == 2
    with pytest.raises(ValueError, match='shape'):
        concat_examples(examples)       # as concat_examples of the batch


def test_padded_fields_keep_their_capacity_and_cut_to_the_batch():
    padding = functools.partial(concat_examples, padding=-1)
    pool = slots(padding=-1)

    def ragged(lengths):
        return [(numpy.arange(n, dtype=numpy.int32), n) for n in lengths]
    layout = fitted(pool, ragged([3, 5, 2, 4]))
    batch = ragged([1, 2, 5, 3])
    whole, results = write(layout, [(0, batch[:2]), (2, batch[2:])])
    stacked, _, _ = read.read_batch(whole, layout, results)
    assert describe(numpy.ascontiguousarray(a) for a in stacked) == \
        describe(padding(batch))


def _odd_examples():
    """Examples of (float32 array of 2x3, label) that mostly match the
    first one, and some that differ in each way a field can."""
    x = numpy.arange(6, dtype=numpy.float32).reshape(2, 3)
    return [
        (x, 1),
        (x + 1, 2),
        (x.astype('>f4'), 3),              # other byte order: converted
        (x.astype(numpy.float64), 4),      # another dtype
        (x[:1], 5),                        # another shape
        (x + 2, numpy.int64(6)),           # a numpy int for a Python int
        (x + 3, 2 ** 63),                  # too large for int64
        (x + 4, -2 ** 63),
        (x + 5, True),                     # a bool for an int
        (x + 6, 7.0),                      # a float for an int
        (x + 7, numpy.int32(8)),
        (x.T.copy().T, 9),                 # Fortran order, same shape
        [x, 10],                           # a list, not a tuple
        (x, 11, 12),                       # another length
        (x + 8, 13),
    ]


@pytest.mark.parametrize('examples', [
    _odd_examples(),
    [numpy.float32(j) for j in range(4)] + [1.5, numpy.float64(2),
                                            numpy.float32(3)],
    [1.5, 2.5, numpy.float64(3), 3.5, 4, True, numpy.float32(5), 6.5],
    [True, False, True, numpy.bool_(True), 1, 0.0, False],
], ids=['arrays-and-labels', 'float32-scalars', 'floats', 'bools'])
def test_examples_like_the_first_are_written_as_every_example_is(examples):
    """``ExampleRows`` (what a worker's sink uses) gives the same bytes
    and results as ``write_stacked_example`` for every example, those
    that match the chunk's first and those that do not."""
    structure = 'tuple' if isinstance(examples[0], tuple) else 'single'
    batch = [examples[0]] * BATCH
    layout = stacked_layout.stacked_layout(batch, len(examples), None)
    assert layout.structure == structure
    start = 2
    wholes, metas = [], []
    for fast in (True, False):
        whole = numpy.zeros(layout.slot_bytes + 64 * 8, dtype=numpy.uint8)
        writer = ExampleRows(whole, layout, start)
        specs = [None] * len(layout.fields)
        out = []
        for row, example in enumerate(examples[:len(examples) - start],
                                      start):
            out.append(writer.write(row, example) if fast else
                       write_stacked_example(whole, layout, start, row,
                                             example, specs))
        wholes.append(whole)
        metas.append(out)
    assert metas[0] == metas[1]
    assert None in metas[0] and metas[0].count(metas[0][0]) > 2
    numpy.testing.assert_array_equal(wholes[0], wholes[1])


def test_shared_mem_widens_the_arrays_never_the_labels():
    # shared_mem counts the arrays: with no padded field the bytes missing
    # go to the largest field of arrays (not a label's row, even when it
    # is larger), and examples with no array keep their layout.
    batch = [(numpy.zeros(4, numpy.uint8), i) for i in range(3)]
    layout = stacked_layout.stacked_layout(batch, 3, None)
    wide = stacked_layout.widen(layout, batch, 3, 100)
    assert [f.row_bytes for f in wide.fields] == [112, 8]
    labels = [(i, 0.5) for i in range(3)]
    layout = stacked_layout.stacked_layout(labels, 3, None)
    assert stacked_layout.widen(layout, labels, 3, 100) is layout


class _Sub(numpy.ndarray):
    pass


class _Label(int):
    pass


def _list_example(kind, j, odd):
    x = numpy.full(3, j, dtype=numpy.float32)
    if kind == 'plain':
        return x, j
    if kind == 'numpy-labels':
        return x, numpy.int64(j)
    if kind == 'int-subclass':
        return x, _Label(j) if odd else j
    if kind == 'list-label':
        return x, [j] if odd else j
    if kind == 'other-byte-order':
        return (x.astype('>f4') if odd else x), j
    if kind == 'array-subclass':
        return (x.view(_Sub) if odd else x), j
    if kind == '0-d-subclass':
        return numpy.array(j).view(_Sub) if odd else numpy.array(j)
    if kind == 'big-arrays':     # rows of more than 4096 bytes
        big = numpy.full(2048, j, dtype=numpy.float32)
        return (big.view(_Sub) if odd else big), j
    raise ValueError(kind)


@pytest.mark.parametrize('kind, exact', [
    ('plain', True), ('numpy-labels', True), ('int-subclass', False),
    ('list-label', False), ('other-byte-order', False),
    ('array-subclass', False), ('0-d-subclass', False),
    ('big-arrays', False)])
def test_a_list_batch_chunk_is_written_as_rows_only_if_it_comes_back_alike(
        kind, exact):
    # List batches (Layout.exact): a chunk goes into the rows at once only
    # when every value comes back from them as it was; else each example
    # goes alone (and the odd one whole).  The chunk's checks agree with
    # exact_rows.exact_columns.
    from chainiter.iterators.pipeline.memory.exact_rows import exact_columns
    # The buffers are fitted to a batch of the kind without its odd one.
    first = [_list_example(kind, j, False) for j in range(BATCH)]
    pool = SlotPool(4, BATCH, True, None, None, exact=True)
    layout = fitted(pool, first)
    assert layout.exact
    examples = [_list_example(kind, j, j == 2) for j in range(BATCH)]
    whole = numpy.zeros(layout.slot_bytes, dtype=numpy.uint8)
    rows = write_stacked_chunk(whole, layout, 0, examples)
    columns = [examples] if layout.structure == 'single' else \
        list(zip(*examples))
    assert exact_columns(columns) is exact
    assert (rows is not None) is exact
    whole, results = write(layout, [(0, examples)])
    stacked, listed, oversize = read.read_batch(whole, layout, results)
    got = listed if stacked is None else stacked
    assert helpers.fingerprint(list(got)) == helpers.fingerprint(examples)


def test_a_task_made_for_replaced_buffers_is_sent_with_their_slot():
    # A task that waits for a worker (its worker retired) while a larger
    # example replaces the buffers is still the task of a batch that reads
    # the old slot with the old layout: it is sent with those, not with
    # no slot (which made a replacement worker's batches come by copy).
    pool = SlotPool(4, BATCH, True, None, None, private=True)
    try:
        first, how = pool.fit(bucket(16), None, [])
        assert how is None
        old = pool.replace(first)
        waiting = types.SimpleNamespace(slot=0, buffer_id=old.id)
        grown, how = pool.fit(bucket(64), first, [])
        assert how is None and grown is not None
        new = pool.replace(grown)
        assert new.id != old.id
        assert pool.buffers_of(waiting) is old
        assert pool.buffers_of(waiting).layout is first
        assert pool.buffers_of(types.SimpleNamespace(
            slot=0, buffer_id=new.id)) is new
        assert pool.buffers_of(types.SimpleNamespace(
            slot=-1, buffer_id=new.id)) is None       # it has no slot
        assert pool.buffers_of(types.SimpleNamespace(
            slot=0, buffer_id=new.id + 1)) is None    # no such buffers
    finally:
        pool.release()
