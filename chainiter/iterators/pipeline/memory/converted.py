"""A converter that runs in the workers (``converter_in_workers=True``).

A batch is then one task: the worker loads its examples, calls
``converter(examples)`` and writes the top-level ndarrays of the result (a
tuple, a dict or a single array) into the batch's slot, as the list layout
writes one example whose region is the whole slot; the rest of the result
travels pickled (so do arrays nested deeper than one level of plain
tuples, lists and dicts, and ndarray subclasses).  The parent rebuilds the
result with views of the slot.
Without a slot, or when the arrays do not fit, the whole result comes
through the pipe (and the buffers grow).  The converter never runs in the
parent.

The converter reaches the workers with the dataset (``WithConverter``), so
that under spawn and forkserver it travels in the dataset's pickle (by
value, with cloudpickle, when the workers cannot import it).
"""

import typing

import numpy

from chainiter.errors import ChainiterError
from chainiter.iterators.pipeline.memory import list_layout
from chainiter.iterators.pipeline.flow import remote
from chainiter.iterators.pipeline.flow.book import short_list
from chainiter.iterators.pipeline.memory.layout import ShmRef, Whole, align

# Arrays this deep in a result go into shared memory: those of the result
# (a tuple, list or dict) and of its tuples, lists and dicts.
_DEPTH = 2


class WithConverter:
    """The dataset and the converter, as the workers are given them."""

    def __init__(self, dataset, converter):
        self.dataset = dataset
        self.converter = converter


def unwrap(dataset):
    """``(dataset, converter or None)`` of what a worker was given."""
    if type(dataset) is WithConverter:
        return dataset.dataset, dataset.converter
    return dataset, None


class Failed(typing.NamedTuple):
    """The converter raised (a ``RemoteError``)."""
    error: object


def write_result(whole, layout, result):
    """Write the arrays of ``result`` into the slot ``whole``; return it
    with ``ShmRef``s in their place, or None when they do not fit."""
    if result_bytes(result) > layout.example_bytes:
        return None
    return _put(whole, result, [0], 0)


def _put(whole, value, offset, depth):
    if list_layout._in_shm(value):
        n = value.nbytes
        start = offset[0]
        numpy.copyto(whole[start:start + n].view(value.dtype).reshape(
            value.shape), value)
        offset[0] += align(n)
        return ShmRef(start, n, value.shape, value.dtype)
    if depth < _DEPTH and type(value) in (tuple, list):
        return type(value)(_put(whole, v, offset, depth + 1) for v in value)
    if depth < _DEPTH and type(value) is dict:
        return {k: _put(whole, v, offset, depth + 1)
                for k, v in value.items()}
    return value


def read_result(base, meta, depth=0):
    """The result ``write_result`` wrote, its arrays viewing ``base``.
    (No closure: a recursive one would be a reference cycle that keeps
    the slot viewed until the garbage collector runs.)"""
    if type(meta) is ShmRef:
        return base[meta.offset:meta.offset + meta.nbytes].view(
            meta.dtype).reshape(meta.shape)
    if depth < _DEPTH and type(meta) in (tuple, list):
        return type(meta)(read_result(base, v, depth + 1) for v in meta)
    if depth < _DEPTH and type(meta) is dict:
        return {k: read_result(base, v, depth + 1) for k, v in meta.items()}
    return meta


def result_bytes(result, depth=0):
    """Bytes the arrays of ``result`` take in a slot."""
    if list_layout._in_shm(result):
        return align(result.nbytes)
    if depth < _DEPTH and type(result) in (tuple, list):
        return sum(result_bytes(v, depth + 1) for v in result)
    if depth < _DEPTH and type(result) is dict:
        return sum(result_bytes(v, depth + 1) for v in result.values())
    return 0


class ConverterSink(list):
    """Collects a batch's examples; its result is the converted batch: its
    arrays written into the slot ``whole`` (a list layout of one region),
    or, without a slot or room, the whole result."""

    def __init__(self, whole, layout, converter):
        super().__init__()
        self.whole, self.layout, self.converter = whole, layout, converter

    def result(self):
        try:
            batch = self.converter(list(self))
        except Exception as e:
            return [Failed(remote.capture(e, -1))]
        if self.whole is not None:
            meta = write_result(self.whole, self.layout, batch)
            if meta is not None:
                return [meta]
        return [Whole(batch)]


def rebuild_error(error, indices):
    """The converter's exception, raised again in the parent, with the
    worker's traceback as ``__cause__``."""
    where = 'the converter raised in a worker process, converting the ' \
        'batch of dataset indices {}'.format(
            short_list(indices))
    if error.exception is not None:
        exception = error.exception
        if hasattr(exception, 'add_note'):
            exception.add_note(where)
    else:
        exception = ChainiterError('{}: {} ({}; the exception itself could '
                                   'not be pickled)'.format(
                                       error.type_name, error.message, where))
    if error.traceback is not None:     # None: raised in this thread
        exception.__cause__ = remote.RemoteTraceback(error.traceback)
    return exception
