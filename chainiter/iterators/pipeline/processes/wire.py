"""What travels between the pool and a worker process, and how it is
framed (the ``Task`` and its result: ``tasks.py``).

To the worker (``multiprocessing.Connection`` framing, read by ``recv``):
``('ready',)`` first, to the workers started while the dataset's arrays
were copied into shared memory (share.py), once they are;
``('layout', buffer_id, Layout)``; ``('slot', buffer_id, index, size)``
followed by the slot's file descriptor; a ``Task`` as ``encode_task`` made
it; ``None`` to exit.  From the worker: a fixed header (generation, seq,
chunk), so that the parent always knows which chunk a result is for,
followed by the pickled ``(metas, error, seconds, queued)`` (``seconds``:
how long the worker took to load the chunk, less ``queued``, the seconds
it waited for a CPU meanwhile: for ``stats`` and the active workers).
Messages of a negative ``seq`` are the worker's own (``worker.STARTED``,
``STARTUP_FAILED``, ``NO_ROOM``).
"""

import os
import pickle
import select
import struct
import traceback

import numpy

from chainiter.iterators._state import Step
from chainiter.iterators.pipeline.memory.list_layout import UniformRows
from chainiter.iterators.pipeline.flow.remote import RemoteError
from chainiter.iterators.pipeline.flow.tasks import Parts, Task, Unreadable
from chainiter.iterators.order_samplers import SeededPermutation


def first_unpicklable(metas, task):
    if type(metas) is UniformRows:
        metas = metas.others or []     # the only part that is not arrays
    elif not isinstance(metas, list):
        metas = []                     # Rows: shapes only
    for index, meta in zip(task.indices, metas):
        try:
            pickle.dumps(meta)
        except Exception:
            return int(index)
    return int(task.indices[min(len(metas), len(task.indices) - 1)])


def encode_task(task):
    """A task as bytes: a plain tuple with the indices as raw int64, which
    costs far less to pickle and unpickle than a list of ints; or, when
    every order of the step is seeded (or the identity), the orders' keys
    instead of the indices: the worker computes them, and the main process
    never does."""
    generation, seq, chunk, start, step, slot, buffer_id, seed, cuts, \
        weight = task
    keys = _order_keys(step)
    indices = None if keys is not None else numpy.asarray(
        step.indices, dtype=numpy.int64).tobytes()
    return pickle.dumps(
        (generation, seq, chunk, start, indices, keys, step.spans, slot,
         buffer_id, seed, cuts, weight), pickle.HIGHEST_PROTOCOL)


def _order_keys(step):
    orders = step.orders
    if orders is None:
        return None
    keys = []
    for order in orders:
        if order is None:
            keys.append(None)
        elif type(order) is SeededPermutation:
            keys.append((order.seed, order.epoch, order.n))
        else:
            return None
    return tuple(keys)


#: The worker's seeded orders, by key (a few: consecutive tasks read
#: neighbouring positions of one or two epochs).
_orders = {}
_KEPT_ORDERS = 4


def _worker_order(key):
    if key is None:
        return None
    order = _orders.get(key)
    if order is None:
        order = _orders[key] = SeededPermutation(*key)
        while len(_orders) > _KEPT_ORDERS:
            del _orders[next(iter(_orders))]
    return order


def decode_task(message):
    generation, seq, chunk, start, indices, keys, spans, slot, buffer_id, \
        seed, cuts, weight = message
    if keys is None:
        step = Step(numpy.frombuffer(indices, dtype=numpy.int64).tolist(),
                    spans)
    else:
        step = Step(Step(None, spans, [_worker_order(k) for k in keys])
                    .indices.tolist(), spans)
    return Task(generation, seq, chunk, start, step, slot, buffer_id, seed,
                cuts, weight)


_HEADER = struct.Struct('<qqq')   # generation, seq, chunk


def header(generation, seq, chunk):
    return _HEADER.pack(generation, seq, chunk)


def send_result(conn, task, metas, error, seconds=0.0, queued=0.0):
    """Send a result as a fixed header, so that the parent always knows
    which chunk it is for, followed by the pickled payload (with the
    seconds the worker spent on it, and those it waited for a CPU)."""
    try:
        payload = pickle.dumps((metas, error, seconds, queued),
                               pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        if type(metas) is Parts:     # a list of metas per segment
            metas = [meta for part in metas.metas for meta in (
                part if isinstance(part, list) else [None] * part.n)]
        index = first_unpicklable(metas, task)
        what = 'example' if error is None else 'exception'
        payload = pickle.dumps(([], RemoteError(
            None, type(e).__qualname__,
            'the {} of dataset[{}] cannot be pickled to send it from the '
            'worker to the main process: {}: {}'.format(
                what, index, type(e).__qualname__, e),
            traceback.format_exc(), index), seconds, queued))
    send_frame(conn, _HEADER.pack(task.generation, task.seq, task.chunk) +
               payload)


_LENGTH = struct.Struct('!i')       # multiprocessing.Connection's framing
_LONG_LENGTH = struct.Struct('!Q')


def frame(data):
    """``data`` framed as ``Connection.send_bytes`` frames it."""
    if len(data) > 0x7fffffff:
        return _LENGTH.pack(-1) + _LONG_LENGTH.pack(len(data)) + data
    return _LENGTH.pack(len(data)) + data


def send_frame(conn, data):
    """``conn.send_bytes(data)`` in one system call and without its Python
    layers (the same framing: ``recv``, ``recv_bytes`` and
    ``receive_results`` read it)."""
    if len(data) > 16384:   # large: not worth a copy to save a call
        conn.send_bytes(data)
        return
    framed = frame(data)
    fd = conn.fileno()
    sent = os.write(fd, framed)
    while sent < len(framed):
        sent += os.write(fd, framed[sent:])


def load_result(payload):
    """A result's payload, ``(metas, error, seconds, queued)``, or an
    ``Unreadable``.  The receiver thread unpickles it before it takes the
    pool's lock: unpickling runs the user's code (``__setstate__``, a
    large example), which the main thread must not wait for."""
    try:
        return pickle.loads(payload)
    except Exception as e:
        return Unreadable(e, traceback.format_exc())


def receive_results(conn):
    """Every result waiting in ``conn``, as ``(generation, seq, chunk,
    payload)`` (``payload``: a memoryview of the pickled rest, see
    ``send_result``); blocks only to complete a message that has begun.

    One system call reads the small messages that are waiting
    (``recv_bytes`` takes two per message); a large one is read straight
    into its buffer."""
    fd = conn.fileno()
    data = os.read(fd, 65536)
    if not data:
        raise EOFError
    out = []
    pos = 0
    while pos < len(data):
        # A frame's header never ends the stream: reading exactly the
        # missing bytes of a header never reads into the next frame.
        data, pos = _at_least(fd, data, pos, _LENGTH.size)
        size, = _LENGTH.unpack_from(data, pos)
        head = _LENGTH.size
        if size == -1:
            data, pos = _at_least(fd, data, pos, head + _LONG_LENGTH.size)
            size, = _LONG_LENGTH.unpack_from(data, pos + head)
            head += _LONG_LENGTH.size
        start, end = pos + head, pos + head + size
        if end <= len(data):
            message = data[start:end]
        else:
            message = bytearray(size)
            have = len(data) - start
            message[:have] = data[start:]
            _read_into(fd, message, have)
        out.append(_HEADER.unpack_from(message) +
                   (memoryview(message)[_HEADER.size:],))
        pos = end
    return out


def _at_least(fd, data, pos, n):
    """``(data, pos)`` with at least ``n`` bytes from ``pos`` on."""
    missing = n - (len(data) - pos)
    if missing <= 0:
        return data, pos
    more = bytearray(missing)
    _read_into(fd, more, 0)
    return data[pos:] + bytes(more), 0


def _read_into(fd, target, filled):
    view = memoryview(target)
    waiting = None
    while filled < len(target):
        try:
            n = os.readv(fd, [view[filled:]])
        except BlockingIOError:     # the parent's end is non-blocking
            # poll, not select: a process with 1024 descriptors open gets
            # higher numbers, which select refuses.
            if waiting is None:
                waiting = select.poll()
                waiting.register(fd, select.POLLIN)
            waiting.poll()
            continue
        if n == 0:
            raise EOFError
        filled += n
