"""The loading pipeline of ``MultiprocessIterator`` and
``MultithreadIterator``: one pipeline, two kinds of workers.

The rooms, in the order the imports run (each imports only those before
it; nothing outside ``processes/`` knows of processes, nothing outside
``threads/`` of threads)::

  flow/       pure bookkeeping and policies: no memory, no threads
  memory/     batches in memory: slots, layouts, writing and reading rows
  pool/       the pool of workers (either kind) and what a worker does
  (here)      the iterator's side: the main thread's steps
  processes/  the process boundary, and MultiprocessIterator
  threads/    worker threads, and MultithreadIterator

- ``flow/``: ``book.py`` (batches, chunks, generations, which worker holds
  which task, what a death means), ``tasks.py`` (a ``Task`` and its
  result), ``reorder.py`` (batches released in order), ``remote.py`` (a
  worker's exception, raised again in the caller), the policies
  ``depth.py`` (the depth within one byte budget), ``grouping.py`` (when
  to group small batches, how many), ``load_meter.py`` (what loading
  cost), ``active_workers.py`` (how many workers take tasks),
  ``worker_stats.py``, ``loading_mode.py`` (worker threads with the GIL:
  whether the main thread loads faster itself).
- ``memory/``: ``slots.py`` (the slots a batch is written into, their
  leases; ``slot_state.py``: a slot, and whether it is free), ``shm.py``
  (one buffer: a shared-memory file for processes, private memory for
  threads; ``shm_files.py``: its file), ``room.py`` (the process's limits),
  the layouts: ``layout.py``, ``list_layout.py``, ``stacked_layout.py``;
  the worker's side: ``sinks.py`` (where a worker puts examples), with
  ``stacked_rows.py`` (a chunk's rows at once), ``example_rows.py`` (one
  example at a time), ``stacked_columns.py`` (a batch method's columns),
  ``row_values.py``, ``exact_rows.py`` (list batches' examples); the
  reader's side: ``read.py`` and ``stacked_read.py``; ``converted.py`` (a
  converter run in the workers); ``fitting.py`` (sizing the buffers from
  a batch, and its warnings).
- ``pool/``: ``pool.py`` (the workers, the book, the slots, under one
  lock; what the main thread calls), ``pool_ready.py`` (its ready queue,
  batches read ahead), ``pool_workers.py`` (starting workers, tasks sent,
  results and exits), ``pool_close.py``; ``load.py`` (a task loaded into
  its sink: what a worker of either kind runs).
- here: ``iterator.py`` (``Pipeline``: steps into tasks, batches back),
  ``iterator_stats.py``, ``options.py`` (the arguments, read once),
  ``transport.py`` (the transport's state), ``reading.py`` (waiting for
  a batch and reading it), ``groups.py`` and ``group_flow.py`` (groups of
  small batches).
- ``processes/``: ``iterator.py`` (``MultiprocessIterator``),
  ``boundary.py`` (what the pool gets for processes), ``checks.py``
  (start method, pickle checks), ``launch.py`` (starting processes; under
  fork from a launcher process without threads), ``worker.py`` (the
  worker process; ``worker_process.py``: its parent watched, its
  scheduling, its global RNGs), ``worker_handle.py`` (the pool's handle
  on one), ``receiver.py`` (the thread that reads from the workers),
  ``outbox.py`` (sends that never block), ``wire.py`` (the messages and
  their framing), ``forks.py`` (a fork of the main process), ``share.py``
  with ``array_places.py``, ``array_pickle.py``, ``shared_arrays.py``
  (under spawn and forkserver the dataset pickled once, its large arrays
  shared) and ``by_value.py`` (cloudpickle).
- ``threads/``: ``iterator.py`` (``MultithreadIterator``), ``workers.py``
  (worker threads: their launcher, the pool's handle on one, the stand-in
  for the receiver, and ``MainThreadTasks``: the tasks ``next()`` loads
  itself in ``pool.wait`` when that is faster, as the worker they were
  given to).

One batch from ``next()`` to a worker and back (``_base.advance`` makes
the step)::

  main thread                         worker (process or thread)
  ───────────                         ──────────────────────────
  iterator.py  _submit ─► pool/pool.py submit
     flow/book.py open_batch, memory/slots.py free ─► a slot
     pool/pool_workers.py _send_task ─► the worker's queue:
        processes: processes/worker_handle.py ─socket─► processes/worker.py
        threads:   threads/workers.py ThreadWorker ──queue──► _serve
        (or, with the GIL when faster, MainThreadTasks: pool/pool.py
        wait runs it in the main thread, as that worker)
                                      pool/load.py run_task:
                                      dataset[i] ─► memory/sinks.py writes
                                      the slot
     results: processes/receiver.py (reads the sockets) or the worker
     thread itself ─► pool/pool_workers.py on_result ─► flow/book.py ─►
     the ready queue, in order (flow/reorder.py)
  reading.py wait ◄─ pool/pool.py wait ◄─ the ready queue
  memory/read.py (views of the slot) ─► the user

A group of small batches loaded as one is not submitted in ``next()``:
``pool.post`` queues it, and the receiver thread (or, with threads, the
worker that delivers a result, or ``next()`` when none is loading)
submits it between the main thread's ``next()`` calls.  While batches go
in groups, whoever delivers a finished batch also reads its arrays
(``Pool._read_ahead``), and ``pool.take`` hands the next one out without
waiting.

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
| ``pool.main_tasks``   | both (a task     | main (loads   | ``pool.lock``;   |
| (threads only): its   | sent), main      | it, then pops | main peeks at    |
| queue, ``on``         | (``switch``)     | it), both     | the first        |
|                       |                  | (``on``)      | without; only    |
|                       |                  |               | main pops        |
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

With worker threads (``threads/workers.py``) there is no receiver
thread, and where the table says "receiver", read "a worker thread":
each takes ``pool.lock`` to deliver its result (``on_result``, reading a
group's batch ahead), to report its exit (``on_exit``, which starts its
replacement), and, after a result, to submit what was posted; ``next()``
submits it when no worker is loading (``NoReceiver.nudge``).  A thread's
tasks come through a ``queue.SimpleQueue``, which never blocks a put.  On
a free-threaded build the attributes read without the lock are still
read and written as one value each (CPython keeps a single attribute
store atomic there too); nothing relies on the GIL beyond that.
"""
