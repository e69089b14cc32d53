"""Reading a finished batch: waiting for it (``wait``), and reading it from
its slot, or its examples that came through the socket (``read``), or
the batch the converter made in a worker (``read_converted``).  Buffers
that do not fit are fitted (``fitting.py``); each reader returns the new
slot bytes, when there are new buffers, for the iterator to tune its
depth to."""

import numpy

from chainiter.errors import ChainiterError, WorkerDiedError
from chainiter.iterators.pipeline.memory import converted
from chainiter.iterators.pipeline.flow import remote, tasks
from chainiter.iterators.pipeline.memory.fitting import outgrown
from chainiter.iterators.pipeline.memory.layout import Whole
from chainiter.iterators.pipeline.memory.read import read_batch


def metas(batch):
    """What each chunk of a finished batch that holds no error tells, a
    padded group's chunk as its parts, one per batch
    (``tasks.segment_metas``)."""
    return tasks.segment_metas(
        [batch.results[i].metas for i in range(batch.n_chunks)])


def wait(pool, handle, timeout):
    """The finished batch of ``handle``, its chunks' results, and the
    error a worker raised loading it (or None)."""
    batch = pool.wait(handle, timeout)
    if batch.failure is not None:
        if type(batch.failure) is WorkerDiedError:
            return batch, None, batch.failure
        raise batch.failure
    for i in range(batch.n_chunks):
        error = batch.results[i].error
        if error is not None:
            return batch, None, remote.rebuild_error(error)
    return batch, metas(batch), None


def read(pool, batch, chunks, fitting):
    """``(stacked, examples, by_copy, slot_bytes, outgrew)``: the stacked
    batch read from its slot, or else its examples, to convert; the slot
    bytes of new buffers (or None); and whether examples came whole for
    being larger than their rows (the buffers were fitted to them)."""
    prepared = batch.prepared
    exporter = pool.hand_out(batch)
    if prepared is not None:    # read by the receiver thread
        return prepared[1], None, False, None, False
    if exporter is None:     # the batch came through the socket
        examples = [meta.example for chunk in chunks for meta in chunk]
        slot_bytes = None
        if pool.slots.layout is None:
            fitting.fit(pool, examples, None, (), False)
            layout = pool.slots.layout
            slot_bytes = 0 if layout is None else layout.slot_bytes
        return None, examples, True, slot_bytes, False
    layout = batch.buffers.layout
    stacked, examples, oversize = read_batch(
        numpy.frombuffer(exporter, dtype=numpy.uint8), layout, chunks,
        batch.cuts)
    if stacked is not None:
        return stacked, None, False, None, False
    slot_bytes = None
    if oversize:
        slot_bytes = fitting.fit(pool, examples, layout, oversize, False)
    # Some of it came through the socket, or the main process stacks it.
    # (Examples read back exactly, for a list batch, were the workers'.)
    return (None, examples, bool(oversize) or (layout.mode == 'stacked' and
                                               not layout.exact),
            slot_bytes, slot_bytes is not None or (
                # (Buffers that cannot grow: the groups stop, as before.)
                not pool.slots.cannot_grow and
                outgrown(pool.slots, layout, oversize)))


def read_converted(pool, batch, chunks, fitting):
    """``(result, by_copy, slot_bytes)``: the batch the converter made in
    a worker, and the slot bytes of new buffers (or None)."""
    parts = [meta for chunk in chunks for meta in chunk]
    if len(parts) != 1:      # a batch cut among workers: never made
        raise ChainiterError(
            'MultiprocessIterator with converter_in_workers=True got a '
            'batch in {} parts; please report this'.format(len(parts)))
    meta, = parts
    if type(meta) is converted.Failed:
        raise converted.rebuild_error(meta.error, batch.step.indices)
    exporter = pool.hand_out(batch)
    if type(meta) is not Whole:
        return converted.read_result(
            numpy.frombuffer(exporter, dtype=numpy.uint8), meta), False, None
    result = meta.example
    layout = None if exporter is None else batch.buffers.layout
    slot_bytes = None
    if layout is not None or pool.slots.layout is None:
        slot_bytes = fitting.fit(pool, [result], layout,
                                 () if layout is None else [result], True)
        if layout is None and pool.slots.layout is not None:
            slot_bytes = pool.slots.layout.slot_bytes
    return result, True, slot_bytes
