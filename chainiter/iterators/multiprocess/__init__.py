"""MultiprocessIterator: examples loaded by worker processes into shared
memory.

::

  main thread: next()            receiver thread            workers
  ───────────────────            ───────────────            ───────
  iterator.py  _base.advance ─► Step
     │
  pool.submit ─────────────┐
  pool.post ─► posted ─────┼──► pool.submit_posted (a group
     │   (a group of small │    of small batches, between
     │    batches)         │    next() calls)
     │                     ▼
     │    book.open_batch, slots.free ─► a slot
     │    Tasks ─► outbox ──────────socket──────────► worker.py
     │    (outbox.py: never blocks;                   wire.py: the
     │     receiver.py writes the rest;               indices of a
     │     a seeded step travels as its               seeded step;
     │     orders' keys: wire.py)                     dataset[i];
     │                                                sinks.py writes
     │                                                the arrays into
     │                                                the slot
     │
  pool.wait ◄─┬─ ready queue ◄── book.on_result ◄──socket── wire.py:
  pool.take ◄─┘  (in order:      ◄── receiver.py           header +
     │            reorder.py)   (a group's batch: read     metadata
     │                           ahead there, read.py)
     │                          ◄── launch.py: a worker exited:
     │                              book.worker_exited, its tasks
     │                              to others
  read.read_batch (views of the slot; a batch read ahead has them
  already) ─► the user

A group of small batches loaded as one is not submitted in ``next()``:
``pool.post`` queues it, and the receiver thread submits it (the same
``pool.submit``) between the main thread's ``next()`` calls.  While batches
go in groups, the receiver thread also reads each finished batch's arrays
(``Pool.read_ahead``), and ``pool.take`` hands the next one out without
waiting.

One file, one idea:

- ``iterator.py``: the iterator; turns steps into batches and back (the
  wiring).  ``iterator_stats.py``: what ``stats`` and ``diagnose`` read
  of it.  ``options.py``: its arguments, read once; ``transport.py``:
  its transport state, in one object; ``reading.py``: waiting for a batch
  and reading it; ``groups.py`` and ``group_flow.py``: groups of small
  batches (their mechanics, and the iterator's steps with them).  The
  pure policies: ``grouping.py`` (when to group, how many),
  ``depth.py`` (the pipeline's depth within one byte budget),
  ``load_meter.py`` (what loading cost, per example),
  ``active_workers.py`` (how many workers take tasks), ``fitting.py``
  (fitting the buffers, and its warnings), ``worker_stats.py``.
- ``pool.py``: the worker processes, the book, the slots and the receiver,
  under one lock; what the main thread calls.  ``pool_ready.py``: its
  ready queue (``take``, batches read ahead); ``pool_workers.py``, under
  the lock: its workers (starts, tasks sent, results, exits);
  ``pool_close.py``: its ``close``.
- ``book.py``: pure bookkeeping (batches, chunks, generations, which worker
  holds which task, what a death means).
- ``receiver.py``: the only thread that reads from the workers; it also
  submits what was posted.
- ``worker_handle.py``: the pool's handle on one worker (its outbox, the
  slots it has been sent).
- ``forks.py``: what a fork of the main process means for the pools.
- ``outbox.py``: sends that never block; ``wire.py``: the messages and
  their framing; ``remote.py``: a worker's exception, raised again here.
- ``launch.py``: starting workers (under fork: from a launcher process that
  has no threads) and learning when they exit.
- ``worker.py``: the worker process (``worker_process.py``: its parent
  watched, its scheduling, its global RNGs); ``sinks.py``: where it puts
  examples;
  ``converted.py``: a converter run in the workers.
- ``share.py``: under spawn and forkserver, the dataset is pickled once
  per pool (every worker, a replacement too, gets those bytes) and its
  large arrays travel to the workers as a read-only shared copy (the main
  process's own arrays stay as they are); ``array_places.py``: where
  such an array lies (pure); ``array_pickle.py``: the pickler that takes
  them out of the dataset's pickle, and the unpickler that views them;
  ``shared_arrays.py``: ``shared_empty`` and ``shared_copy``, arrays in
  shared memory from the start; ``by_value.py``: what
  the workers cannot import (a notebook's classes, lambdas) goes by value,
  through cloudpickle (the one module that imports it).
- ``slots.py``: the shared-memory slots, their leases and layouts
  (``slot_state.py``: a slot, and whether it is free to reuse);
  ``room.py``: whether the process's limits leave room for one more;
  ``shm.py``: one shared buffer (``shm_files.py``: its
  file, and the room for it); ``layout.py``, ``list_layout.py``,
  ``stacked_layout.py``, ``row_values.py`` (what a row was written
  from), ``stacked_rows.py`` (a chunk's rows at once),
  ``example_rows.py`` (one example at a time), ``stacked_columns.py``,
  ``stacked_read.py``, ``exact_rows.py`` (list batches' examples),
  ``read.py``: where the arrays of a batch go in a slot, and how they are
  read back.

Threads
-------

The main thread is the one that calls ``next()`` (``close`` may run in
any thread: a finalizer runs where the iterator is collected).  The
receiver thread is the pool's own.  ``pool.lock`` is a C lock (an
interrupt cannot leave it held) and guards what both threads change.  A
Ctrl-C lands only in the main thread, so it waits for the lock before it
enters ``uninterrupted()``, never inside (``with pool.lock,
uninterrupted():``).  ``next()`` takes the lock only in ``submit`` and in
``hand_out`` of a batch not read ahead; ``wait`` and ``take`` never do.
Plain attributes written in one store and read as one value need no
lock (the GIL makes those atomic); the table says where that is the rule.

+-----------------------+------------------+---------------+------------------+
| State                 | Written by       | Read by       | Guarded by       |
+=======================+==================+===============+==================+
| ``pool.book``:        | main (submit,    | both          | ``pool.lock``    |
| batches, tasks,       | new_gen.,        |               |                  |
| generations, busy     | set_depth),      |               |                  |
| slots, workers held   | receiver         |               |                  |
+-----------------------+------------------+---------------+------------------+
| ``book.generation``   | main (new_gen.)  | both          | written under    |
|                       |                  |               | the lock; main   |
|                       |                  |               | reads without    |
+-----------------------+------------------+---------------+------------------+
| ``book.active`` and   | main             | receiver      | none: the main   |
| the ``ActiveWorkers`` | (handed_out,     | (``assign``)  | thread's; one    |
| count                 | set_depth)       |               | store, one read  |
+-----------------------+------------------+---------------+------------------+
| ``book.load_s``,      | receiver         | main (stats,  | ``pool.lock``    |
| ``loaded``,           | (on_result)      | groups,       | for the writes;  |
| ``queued_s``          |                  | handed_out)   | main reads       |
|                       |                  |               | without          |
+-----------------------+------------------+---------------+------------------+
| ``pool.slots``:       | main, receiver   | both          | ``pool.lock``    |
| buffers, slots,       | (a posted group) |               |                  |
| allocation            |                  |               |                  |
+-----------------------+------------------+---------------+------------------+
| ``Slot.owner``        | main             | both; main    | none: ``idle``   |
| cleared by            |                  |               | reads the owner  |
| ``hand_over``;        |                  |               | once             |
| ``Slot.kept``;        |                  |               |                  |
| ``fit``               |                  |               |                  |
+-----------------------+------------------+---------------+------------------+
| ``pool.read_ahead``   | main             | receiver      | ``pool.lock``    |
|                       | (set_read_ahead) | (_put_ready)  |                  |
+-----------------------+------------------+---------------+------------------+
| ``pool.batches_ahead``| main (set_depth) | both (the     | ``pool.lock``    |
|                       |                  | no-slot       |                  |
|                       |                  | warning)      |                  |
+-----------------------+------------------+---------------+------------------+
| ``pool.posted``       | main (append)    | both          | ``pool.lock``    |
|                       |                  | (popleft)     | for pops; an     |
|                       |                  |               | append is atomic |
+-----------------------+------------------+---------------+------------------+
| ``pool.ready`` queue  | receiver, main   | main          | its own          |
|                       | (close,          |               | (SimpleQueue)    |
|                       | new_gen.)        |               |                  |
+-----------------------+------------------+---------------+------------------+
| ``pool._box``,        | main             | main          | none             |
| ``pool.waiting``      |                  |               |                  |
+-----------------------+------------------+---------------+------------------+
| ``pool.workers``,     | receiver (main   | both          | ``pool.lock``;   |
| ``pool.gone``         | at start and     |               | ``_watch`` reads |
|                       | close)           |               | a copy without   |
+-----------------------+------------------+---------------+------------------+
| ``pool.events``       | both             | main          | ``pool.lock``    |
+-----------------------+------------------+---------------+------------------+
| ``pool.closed``       | main (close)     | both          | none: one store  |
+-----------------------+------------------+---------------+------------------+
| ``Worker.buffer_id``, | both             | both          | ``pool.lock``    |
| ``has_slots``,        |                  |               |                  |
| ``started``           |                  |               |                  |
+-----------------------+------------------+---------------+------------------+
| ``Worker.at_eof``     | receiver         | receiver      | none             |
+-----------------------+------------------+---------------+------------------+
| an outbox's messages, | both             | both          | the outbox's     |
| ``torn``, ``dead``    |                  |               | lock;            |
|                       |                  |               | ``pending`` is a |
|                       |                  |               | hint             |
+-----------------------+------------------+---------------+------------------+
| the launcher (start,  | receiver (main   | receiver      | ``pool.lock``;   |
| exits)                | at start)        |               | the fork         |
|                       |                  |               | helper's socket: |
|                       |                  |               | its own lock     |
+-----------------------+------------------+---------------+------------------+
| the receiver's flags  | both             | receiver      | none: a flag,    |
| (``_wanted``,         |                  |               | then a wake-up   |
| ``_check``,           |                  |               | (pipe or lock)   |
| ``_dirty``)           |                  |               |                  |
+-----------------------+------------------+---------------+------------------+
| a ``SharedBuffer``'s  | any              | ``release``   | its own lock     |
| release callbacks     | (when_released)  |               |                  |
+-----------------------+------------------+---------------+------------------+

What the receiver thread does under ``pool.lock``: a worker's results
(``book.on_result``; they are unpickled before, without the lock:
``wire.load_result``), its exit and the workers
started in its place, a posted group's ``submit`` (with its slots: slot
allocation runs in this thread too), reading a finished batch ahead.
It reads the sockets, writes the outboxes and rests without it.  At a
fork, the forking thread takes the lock to retire the slots the child
may read (``forks.py``).  Each method of ``Pool`` says which thread calls
it.
"""

from chainiter.iterators.multiprocess.iterator import (  # NOQA
    MultiprocessIterator)
