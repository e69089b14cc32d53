"""The worker process: turns tasks (dataset indices, or the seeded orders
and positions they come from) into examples.

A worker reads the messages of ``wire.py`` from its socket: layouts and
slots to write into, and tasks.  For a task it loads the examples, writes
their arrays into the task's slot (``sinks.py``) and sends back the small
metadata of each example (or the example itself when there is no slot or
it does not fit), or the exception.

It exits by itself when the parent's end of the pipe closes, and (on Linux)
is killed by the kernel when the parent dies.  It ignores SIGINT: Ctrl-C is
the parent's to handle.
"""

import os
import pickle
import signal
from multiprocessing import reduction

import numpy

from chainiter import _context
from chainiter.iterators.pipeline.memory import converted
from chainiter.iterators.pipeline.pool import load
from chainiter.iterators.pipeline.flow import remote
from chainiter.iterators.pipeline.processes import share, wire
from chainiter.iterators.pipeline.memory.shm import SharedBuffer, reserve_pages
from chainiter.iterators.pipeline.processes.worker_process import (
    seed_global_rngs, watch_parent, yield_to_the_trainer)


#: ``seq`` of the message a worker sends when it cannot start.
STARTUP_FAILED = -1
#: ``seq`` of the message a worker sends first: Python has started it (a
#: worker that exits before it was never ours to run: see pool.on_exit).
STARTED = -2
#: ``seq`` of the message a worker sends (once) when it could not reserve
#: a slot: ``(size, reason)``.
NO_ROOM = -3


def worker_main(conn, dataset, seed, worker_id, incarnation, num_workers,
                worker_init_fn, parent_pid, max_tasks, by_main_thread):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield_to_the_trainer()
    watch_parent(parent_pid, by_main_thread)
    try:
        wire.send_frame(conn, wire.header(0, STARTED, 0))
    except (BrokenPipeError, EOFError, ConnectionResetError):
        return
    stream = load.worker_stream(worker_id, num_workers, incarnation)
    _context.set_worker_info(_context.WorkerInfo(
        worker_id, num_workers, seed + stream, incarnation))
    set_up = _set_up(conn, dataset, seed, worker_id, stream, worker_init_fn)
    if set_up is None:
        return
    dataset, converter = set_up
    # A batch method loads a task's chunk in one call: an error there is
    # the whole chunk's.
    batched = _context.batch_method(dataset) is not None
    layout = None
    buffer_id = -1
    slots = {}
    done = 0
    run_queue = load.RunQueueClock()
    warned_no_room = False
    while max_tasks is None or done < max_tasks:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        if message[0] == 'ready':     # the arrays of a dataset it had
            continue
        if message[0] == 'layout':
            _, buffer_id, layout = message
            slots = {}
            continue
        if message[0] == 'slot':
            warned_no_room = _receive_slot(conn, message, buffer_id, slots,
                                           warned_no_room)
            if warned_no_room is None:
                return
            continue
        task = wire.decode_task(message)
        whole = slots.get(task.slot) if task.buffer_id == buffer_id else None
        if not _run_task(conn, dataset, converter, batched, task, whole,
                         layout, run_queue):
            return
        done += task.weight


def _set_up(conn, dataset, seed, worker_id, stream, worker_init_fn):
    """``(dataset, converter)``: the dataset (its arrays mapped, under
    spawn and forkserver) and the converter to run here, once the global
    RNGs are seeded and ``worker_init_fn`` has run; None when the worker
    is to exit (the pool closed, or it could not start: the pool was told
    why)."""
    what = 'the dataset (and worker_init_fn) could not be unpickled in ' \
        'the worker'
    try:
        if isinstance(dataset, share.Received):      # spawn, forkserver
            if dataset.wait:        # until its arrays are in shared memory
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    return None
                if message is None:     # the pool closed meanwhile
                    return None
                if message != ('ready',):
                    raise RuntimeError('the pool sent {!r} before its ready '
                                       'message'.format(message))
            dataset, worker_init_fn = dataset.load()
        dataset, converter = converted.unwrap(dataset)
        what = 'seeding the global RNGs (random, numpy, torch) failed'
        # After the dataset (its module may import torch), before
        # worker_init_fn (which may seed otherwise).
        seed_global_rngs(seed, stream)
        what = 'worker_init_fn({}) raised'.format(worker_id)
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
    except Exception as e:
        error = remote.capture(e, -1)
        error = error._replace(message='{}: {}'.format(what, error.message))
        try:
            wire.send_frame(conn, wire.header(0, STARTUP_FAILED, 0) +
                            remote.startup_payload(error))
        except (BrokenPipeError, EOFError, ConnectionResetError):
            pass
        return None
    return dataset, converter


def _receive_slot(conn, message, buffer_id, slots, warned_no_room):
    """Map the slot that ``message`` announces (its descriptor follows it
    on ``conn``) into ``slots``, by index, when it is of the buffers in
    use (``buffer_id``).  Returns ``warned_no_room`` (whether the pool was
    told of a slot that could not be reserved, as of now), or None when
    the worker is to exit."""
    _, owner, index, size = message
    try:
        fd = reduction.recv_handle(conn)
    except (EOFError, OSError, RuntimeError):
        return None     # retired in the middle of a message
    # Reserved before it is written (slots.py): a page that cannot be had
    # would kill this worker with SIGBUS.
    no_room = reserve_pages(fd, size)
    if no_room is not None:
        os.close(fd)    # its tasks send their examples instead
        if owner == buffer_id:
            # Not the slot this index had before (retired at a fork: a
            # user's array or a child may view it still).
            slots.pop(index, None)
        if not warned_no_room:
            try:
                wire.send_frame(conn, wire.header(0, NO_ROOM, 0) +
                                pickle.dumps((size, no_room)))
            except (BrokenPipeError, EOFError, ConnectionResetError):
                return None
        return True
    # Its pages mapped at once, in one call: page by page, at the first
    # write, 16 workers spent seconds in page faults.
    shared = SharedBuffer(size, fd, populate=True)
    if owner == buffer_id:
        slots[index] = numpy.frombuffer(shared.buffer, dtype=numpy.uint8)
    shared.close()     # the mapping stays while the array lives
    return warned_no_room


def _run_task(conn, dataset, converter, batched, task, whole, layout,
              run_queue):
    """Load the task's examples into ``whole`` (its slot, or None) and
    send the result home; False when the parent's end is closed."""
    metas, error, seconds, queued = load.run_task(
        dataset, converter, batched, task, whole, layout, run_queue)
    try:
        wire.send_result(conn, task, metas, error, seconds, queued)
    except (BrokenPipeError, EOFError, ConnectionResetError):
        return False
    return True
