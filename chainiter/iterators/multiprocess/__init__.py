"""MultiprocessIterator: examples loaded by worker processes into shared memory.

::

  main thread: next()                 receiver thread          workers
  ───────────────────                 ───────────────          ───────
  iterator.py  _base.advance ─► Step
     │
  pool.submit ─► book.open_batch ─► Tasks ─► outbox ──socket──► worker.py
     │           slots.free ─► a slot        (outbox.py:         wire.py: the
     │           (a seeded step travels      never blocks;       indices of a
     │            as its orders' keys:       receiver.py         seeded step;
     │            wire.py)                   writes the rest)    dataset[i]
     │                                                            sinks.py writes
     │                                                            the arrays into
     │                                                            the slot
     │
  pool.wait ◄── ready queue ◄── book.on_result ◄──socket──── wire.py: header
     │          (in order:       ◄── receiver.py               + metadata
     │           reorder.py)     ◄── launch.py: a worker exited:
     │                               book.worker_exited, its tasks to others
  read.read_batch (views of the slot) ─► the user

A group of small batches loaded as one is not submitted in ``next()``:
``pool.post`` queues it, and the receiver thread submits it (the same
``pool.submit``) between the main thread's ``next()`` calls.

One file, one idea:

- ``iterator.py``: the iterator; turns steps into batches and back.
- ``pool.py``: the worker processes, the book, the slots and the receiver,
  under one lock; what the main thread calls.
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
- ``worker.py``: the worker process; ``sinks.py``: where it puts examples.
- ``share.py``: under spawn and forkserver, the dataset's large arrays
  travel to the workers as a read-only shared copy (the main process's
  own arrays stay as they are); ``by_value.py``: what
  the workers cannot import (a notebook's classes, lambdas) goes by value,
  through cloudpickle (the one module that imports it).
- ``slots.py``: the shared-memory slots, their leases and layouts;
  ``shm.py``: one shared buffer; ``layout.py``, ``list_layout.py``,
  ``stacked_layout.py``, ``stacked_rows.py``, ``read.py``: where the arrays
  of a batch go in a slot, and how they are read back.
"""

from chainiter.iterators.multiprocess.iterator import (  # NOQA
    MultiprocessIterator)
