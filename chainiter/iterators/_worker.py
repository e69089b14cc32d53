"""The worker process: turns tasks (lists of indices) into examples.

A worker reads messages from its pipe, in order:

- ``('layout', buffer_id, Layout)``: the slots of this layout follow;
- ``('slot', buffer_id, index, size)`` followed by the slot's file
  descriptor: a slot to write into;
- a ``Task`` (as ``encode_task`` made it): load the examples, write
  their arrays into the task's slot, and send back the small metadata of
  each example (or the example itself when there is no slot or it does
  not fit), or the exception;
- ``None``: exit.

It exits by itself when the parent's end of the pipe closes, and (on Linux)
is killed by the kernel when the parent dies.  It ignores SIGINT: Ctrl-C is
the parent's to handle.
"""

import ctypes
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
import traceback
import typing
from multiprocessing import reduction

import numpy

from chainiter import _context
from chainiter.iterators import _layout
from chainiter.iterators._shm import SharedBuffer

_PARENT_CHECK_S = 0.5   # how often a worker checks that its parent lives


class Task(typing.NamedTuple):
    generation: int
    seq: int
    chunk: int
    start: int              # row of the first example within the batch
    indices: object         # int array in the parent, list in the worker
    spans: tuple            # epochs and positions, as in Step
    slot: int               # index of the slot to write into, or -1
    buffer_id: int
    seed: int               # keys example_rng()


def encode_task(task):
    """A task as bytes: a plain tuple with the indices as raw int64, which
    costs far less to pickle and unpickle than a list of ints."""
    generation, seq, chunk, start, indices, spans, slot, buffer_id, seed = \
        task
    return pickle.dumps(
        (generation, seq, chunk, start,
         numpy.asarray(indices, dtype=numpy.int64).tobytes(), spans, slot,
         buffer_id, seed), pickle.HIGHEST_PROTOCOL)


def decode_task(message):
    generation, seq, chunk, start, indices, spans, slot, buffer_id, seed = \
        message
    return Task(generation, seq, chunk, start,
                numpy.frombuffer(indices, dtype=numpy.int64).tolist(), spans,
                slot, buffer_id, seed)


class Result(typing.NamedTuple):
    generation: int
    seq: int
    chunk: int
    metas: object           # Rows, or per example its metadata or a Whole
    error: object = None    # a RemoteError when loading failed


class RemoteError(typing.NamedTuple):
    """An exception raised in a worker, sent home with its traceback."""
    exception: object       # the exception, or None if it could not be pickled
    type_name: str
    message: str
    traceback: str
    index: int


class RemoteTraceback(Exception):
    """Holds the formatted traceback of a worker; set as ``__cause__``."""

    def __init__(self, tb):
        super().__init__(tb)
        self.tb = tb

    def __str__(self):
        return '\n\n"""\n{}"""'.format(self.tb)


def watch_parent(parent_pid, by_main_thread):
    """Exit when the parent dies, even while ``dataset[i]`` is stuck."""
    # The kernel's parent-death signal fires when the THREAD that started
    # the worker ends: use it only for workers the main thread started.
    if by_main_thread and os.getppid() == parent_pid and \
            sys.platform.startswith('linux'):
        _set_parent_death_signal()   # the kernel kills us at once
    # Under forkserver the parent is the server, so also check by pid.
    def watch():
        while _alive(parent_pid):
            time.sleep(_PARENT_CHECK_S)
        os._exit(1)
    threading.Thread(target=watch, name='chainiter-parent-watch',
                     daemon=True).start()


def _alive(pid):
    """False once ``pid`` has exited (a zombie counts as exited)."""
    try:
        with open('/proc/{}/stat'.format(pid), 'rb') as f:
            return f.read().rsplit(b')', 1)[1].split()[0] not in (b'Z', b'X')
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _set_parent_death_signal():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _remote_error(e, index):
    tb = ''.join(traceback.format_exception(type(e), e, e.__traceback__))
    try:
        pickle.loads(pickle.dumps(e))
        exception = e
    except Exception:
        exception = None
    return RemoteError(exception, type(e).__qualname__, str(e), tb, index)


class PickledDataset:
    """The dataset for a spawned worker, unpickled by the worker itself, so
    that a failure is reported to the parent like any other."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __reduce__(self):
        return PickledDataset, (pickle.dumps(self.dataset,
                                             pickle.HIGHEST_PROTOCOL),)


#: ``seq`` of the message a worker sends when it cannot start.
STARTUP_FAILED = -1


def worker_main(conn, dataset, seed, worker_id, num_workers,
                worker_init_fn, parent_pid, max_tasks, by_main_thread):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch_parent(parent_pid, by_main_thread)
    _context.set_worker_info(_context.WorkerInfo(worker_id, num_workers,
                                                 seed + worker_id))
    what = 'the dataset could not be unpickled in the worker'
    try:
        if type(dataset) is PickledDataset:
            dataset = pickle.loads(dataset.dataset)
        what = 'worker_init_fn({}) raised'.format(worker_id)
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
    except Exception as e:
        error = _remote_error(e, -1)
        error = error._replace(message='{}: {}'.format(what, error.message))
        try:
            send_frame(conn, _HEADER.pack(0, STARTUP_FAILED, 0, worker_id)
                       + pickle.dumps(([], error), pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, EOFError, ConnectionResetError):
            pass
        return
    layout = None
    buffer_id = -1
    slots = {}
    done = 0
    while max_tasks is None or done < max_tasks:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        if message[0] == 'layout':
            _, buffer_id, layout = message
            slots = {}
            continue
        if message[0] == 'slot':
            _, owner, index, size = message
            shared = SharedBuffer(size, reduction.recv_handle(conn))
            if owner == buffer_id:
                slots[index] = numpy.frombuffer(shared.buffer,
                                                dtype=numpy.uint8)
            shared.close()     # the mapping stays while the array lives
            continue
        task = decode_task(message)
        whole = slots.get(task.slot) if task.buffer_id == buffer_id else None
        if whole is None:
            sink = _WholeSink()
        elif layout.mode == 'list' and \
                layout.example_bytes >= _STREAM_BYTES:
            sink = _ListSink(whole, 0, layout, task.start)
        elif layout.mode == 'list':
            sink = _ListChunkSink(whole, 0, layout, task.start)
        elif _layout.row_bytes(layout) >= _STREAM_BYTES:
            sink = _StackedSink(whole, 0, layout, task.start)
        else:
            sink = _StackedChunkSink(whole, 0, layout, task.start)
        error = None
        try:
            _context.load_examples(dataset, task.indices, task.seed,
                                   task.spans, sink)
        except Exception as e:
            error = _remote_error(e, int(task.indices[len(sink)]))
        metas = [] if error is not None else sink.result()
        try:
            send_result(conn, task, worker_id, metas, error)
        except (BrokenPipeError, EOFError, ConnectionResetError):
            return
        done += 1


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

    def __init__(self, whole, slot_start, layout, row):
        self.whole, self.slot_start, self.layout = whole, slot_start, layout
        self.row = row
        self.metas = []

    def append(self, example):
        meta = self.write(example)
        self.metas.append(_layout.Whole(example) if meta is None else meta)
        self.row += 1

    def __len__(self):
        return len(self.metas)


class _ListSink(_EachSink):

    def write(self, example):
        return _layout.write_list_example(
            self.whole, self.slot_start + self.row * self.layout.example_bytes,
            self.layout, example)

    def result(self):
        return self.metas


class _StackedSink(_EachSink):

    def write(self, example):
        return _layout.write_stacked_example(
            self.whole, self.slot_start, self.layout, self.row, example)

    def result(self):
        return _layout.as_rows(self.layout, self.metas)


class _ChunkSink(list):
    """Collects the (small) examples of a task, then writes them all with a
    few numpy calls per field."""

    def __init__(self, whole, slot_start, layout, row):
        super().__init__()
        self.whole, self.slot_start, self.layout = whole, slot_start, layout
        self.row = row

    def _one_by_one(self, sink_type):
        sink = sink_type(self.whole, self.slot_start, self.layout, self.row)
        for example in self:
            sink.append(example)
        return sink.result()


class _ListChunkSink(_ChunkSink):

    def result(self):
        if not self:
            return []
        start = self.slot_start + self.row * self.layout.example_bytes
        rows = _layout.write_list_chunk(self.whole, start, self.layout, self)
        return self._one_by_one(_ListSink) if rows is None else rows


class _StackedChunkSink(_ChunkSink):

    def result(self):
        rows = _layout.write_stacked_chunk(
            self.whole, self.slot_start, self.layout, self.row, self)
        return self._one_by_one(_StackedSink) if rows is None else rows


_HEADER = struct.Struct('<qqqq')   # generation, seq, chunk, worker


def send_result(conn, task, worker_id, metas, error):
    """Send a result as a fixed header, so that the parent always knows
    which chunk it is for, followed by the pickled payload."""
    try:
        payload = pickle.dumps((metas, error), pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        index = _first_unpicklable(metas, task)
        what = 'example' if error is None else 'exception'
        payload = pickle.dumps(([], RemoteError(
            None, type(e).__qualname__,
            'the {} of dataset[{}] cannot be pickled to send it from the '
            'worker to the main process: {}: {}'.format(
                what, index, type(e).__qualname__, e),
            traceback.format_exc(), index)))
    send_frame(conn, _HEADER.pack(task.generation, task.seq, task.chunk,
                                  worker_id) + payload)


_LENGTH = struct.Struct('!i')       # multiprocessing.Connection's framing
_LONG_LENGTH = struct.Struct('!Q')


def send_frame(conn, data):
    """``conn.send_bytes(data)`` in one system call and without its Python
    layers (the same framing: ``recv``, ``recv_bytes`` and
    ``receive_results`` read it)."""
    if len(data) > 16384:   # large: not worth a copy to save a call
        conn.send_bytes(data)
        return
    frame = _LENGTH.pack(len(data)) + data
    fd = conn.fileno()
    sent = os.write(fd, frame)
    while sent < len(frame):
        sent += os.write(fd, frame[sent:])


def receive_results(conn):
    """Every result waiting in ``conn``, as ``(generation, seq, chunk,
    worker, payload)``; blocks only to complete a message that has begun.

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
    while filled < len(target):
        try:
            n = os.readv(fd, [view[filled:]])
        except BlockingIOError:     # the parent's end is non-blocking
            select.select([fd], [], [])
            continue
        if n == 0:
            raise EOFError
        filled += n


def _first_unpicklable(metas, task):
    if type(metas) is _layout.UniformRows:
        metas = metas.others or []     # the only part that is not arrays
    elif not isinstance(metas, list):
        metas = []                     # Rows: shapes only
    for index, meta in zip(task.indices, metas):
        try:
            pickle.dumps(meta)
        except Exception:
            return int(index)
    return int(task.indices[min(len(metas), len(task.indices) - 1)])
