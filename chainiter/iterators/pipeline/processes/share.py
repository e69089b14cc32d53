"""Large numpy arrays of a dataset, shared with spawned workers.

Under spawn and forkserver a worker gets the dataset by pickling, and each
worker would unpickle a private copy of every array in it.  Instead the
pair ``(dataset, worker_init_fn)`` is pickled (in one pickle, so that what
goes by value is one copy for both) by ``Pickler`` (array_pickle.py),
which takes every large array out of the stream.  It is pickled once, at
the pool's first worker start; every later worker (a replacement after a
death or ``maxtasksperchild``) gets the same bytes and blocks:

::

  main process: ArrayShare (one per pool)             worker
  ───────────────────────────────────────             ──────
  Shipped.__reduce__ (at every worker start)
    ArrayShare.pickled(): the first time,
    Pickler.dump(obj)
      large ndarray ─► seen before in this pickle?  its Place
                       a numpy.memmap of a file: (filename, offset)
                       else: a Place in the block
      a class or function the worker cannot import (a notebook's, a
      lambda, a closure: by_value.py) ─► pickled again by _CloudPickler,
                       which sends those by value (cloudpickle)
      anything else ─► pickled as usual
    the block: SharedBuffer.allocate; the arrays copied in
    (by ``fill``, after the first workers started), unmapped (only its
    descriptor kept); later: the same bytes and blocks
    ─► Received(bytes, {key: (size, DupFd)}) ── Process args ──► Received.load()
                                                        (first waits for
                                                        ('ready',) when the
                                                        block was not filled)
                                                        blocks mapped read-only,
                                                        Unpickler: views of them

The pool's first workers are started before the arrays are copied: the
pickle needs only where each array will be in the block, not its values.
The copy (0.4-0.5 s a GiB) then overlaps with what a worker does before it
needs the dataset (starting Python, importing numpy and the dataset's
modules: 0.3-0.4 s), and the pool tells each of those workers when the
block is filled (``defer``, ``fill``).

What is taken out: every object the pickler meets whose type is exactly
``numpy.ndarray`` or ``numpy.memmap``, with a dtype that holds no Python
objects and at least ``SHARE_MIN_BYTES`` bytes, wherever it is (an
attribute, a list, a dict, inside any picklable object).  Other subclasses
(``numpy.ma``, ``numpy.matrix``, ``numpy.recarray``, ...), object arrays
and smaller arrays are pickled by value, as before.

- The main process's own arrays are never moved, remapped or otherwise
  touched: the block holds a copy, so the process tree holds such an
  array twice (the main process's and the block), never once per worker.
  When the arrays copied for one pool pass ``COPY_WARN_BYTES``, the pool
  warns once, naming the ways to hold them once.  The share keeps no
  reference to them once they are copied: an array the program drops or
  replaces is freed.
- The worker's arrays are read-only views of the block: writing raises
  numpy's ``ValueError: assignment destination is read-only``.
- Non-contiguous arrays are copied contiguous (C order) into the block;
  Fortran-ordered ones stay Fortran-ordered.
- An array reached twice is stored once (places are remembered by
  ``id()`` while pickling).  Every worker, a replacement too, sees the
  whole dataset (its attributes, small and large arrays) as it was at the
  pool's first worker start: what the main process writes into it or
  replaces later stays its own, and the pool holds one block for its
  life however often workers are replaced.
- A ``numpy.memmap`` of a named file (opened with mode 'r', 'r+' or 'w+',
  or a view of one) is passed by file name and offset: the worker maps the
  same file read-only, so the OS shares its pages.  Its workers see what
  is in the file (as under fork); a copy-on-write memmap (mode 'c') is
  copied into the block instead, since its changes are not in the file.
- Arrays made by ``shared_empty`` / ``shared_copy`` (or views of them)
  already live in shared memory: they are passed as their own block, not
  copied, so the process tree holds one copy of them (the main process's
  array is the workers' too).  Workers map it read-only but see what the
  main process writes into it later (as with a memmap).
- Arrays that view other shared memory (e.g. batches of another iterator)
  are copied into the block like any array.

Here: ``ArrayShare`` owns the pickle and its blocks; ``Shipped`` and
``Received`` are the two ends.  The pure parts, ``shareable``, ``place``
and ``view``, are in array_places.py; the pickler and unpickler in
array_pickle.py; ``shared_empty`` and ``shared_copy``, which make the
arrays that need no block, in shared_arrays.py.
"""

import collections
import io
import os
import threading
from multiprocessing import reduction

import numpy

from chainiter._interrupts import uninterrupted
from chainiter.iterators.pipeline.processes.array_pickle import Unpickler, dump
from chainiter.iterators.pipeline.processes.array_places import Place, view
from chainiter.iterators.pipeline.memory.shm import SharedBuffer

#: When the arrays copied into one pool's blocks pass this many bytes, the
#: pool warns (once) that the process tree holds them twice.
COPY_WARN_BYTES = 2 ** 30

#: Arrays are copied into a block this many bytes at a time.
STEP_BYTES = 64 * 2 ** 20


class ArrayShare:
    """The one pickle of what a pool's workers get (``obj``: its dataset
    and worker_init_fn), and the shared blocks it refers to.

    ``pickled`` runs at every worker start (any thread): the first call
    pickles ``obj`` and lets it go, every later one returns the same
    bytes and blocks (the bytes, the pickle less its large arrays, are
    kept for the pool's life).  ``release`` when the pool closes, after its
    workers have ended.
    """

    #: The key of the block that the pickle's own arrays are copied into.
    BLOCK = 0

    def __init__(self, obj):
        self._lock = threading.Lock()
        self._obj = obj
        self._pickled = None    # (bytes, {key: block}), once pickled
        self._blocks = {}       # key -> SharedBuffer, its descriptor only
        self._released = False
        self._lent = {}         # id(mapping) -> (key, _Lent): kept alive
        self._copied = 0        # bytes of arrays copied into blocks
        self._warned = False
        self._unfilled = None   # while deferring: [(key, block, arrays)]

    def lend(self, mapping, fd, size):
        """The key of ``shared_empty``'s ``mapping`` among the blocks; the
        share keeps it (and so its descriptor) alive until released."""
        found = self._lent.get(id(mapping))
        if found is None:
            found = self._lent[id(mapping)] = (
                'lent-{}'.format(len(self._lent)), _Lent(size, fd, mapping))
        return found[0]

    def defer(self):
        """Until ``fill()``: the block is made (its size is known) but the
        arrays are not copied into it yet.  The workers it is sent to must
        not read it before the pool tells them (``unfilled``)."""
        with self._lock:
            self._unfilled = []

    def fill(self):
        """Copy the arrays into the block made since ``defer()``; True
        when there was one.  Stops deferring."""
        with self._lock:
            unfilled, self._unfilled = self._unfilled or [], None
            for _, shared, arrays in unfilled:
                shared.reserve()
                self._fill(shared, arrays)
            return bool(unfilled)

    def unfilled(self, blocks):
        """Whether some of ``blocks`` (as ``pickled`` returned them) are
        not filled yet."""
        with self._lock:
            return any(key in blocks for key, _, _ in self._unfilled or ())

    def pickled(self):
        """``(bytes, {key: SharedBuffer})``: ``obj`` pickled (at the first
        call), and the blocks the bytes refer to."""
        with self._lock:
            if self._released:
                raise RuntimeError('the shared arrays were released')
            if self._pickled is None:
                self._pickled = self._dump(self._obj)
                self._obj = None
            return self._pickled

    def _dump(self, obj):
        """``obj`` pickled, its new block made (filled unless deferring);
        under the lock."""
        key = self.BLOCK
        stream = io.BytesIO()
        pickler = dump(obj, stream, key, self.lend)
        if key in pickler.used and self._unfilled is not None:
            # Recorded as soon as made: an interrupt leaves no block that
            # release() would not close.
            with uninterrupted():
                shared = SharedBuffer.allocate(pickler.size, reserve=False)
                self._blocks[key] = shared
                self._unfilled.append((key, shared, pickler.new))
        elif key in pickler.used:
            shared = SharedBuffer.allocate(pickler.size)
            try:
                self._fill(shared, pickler.new)
            except BaseException:
                shared.release()
                raise
            self._blocks[key] = shared
        self._copied += sum(array.nbytes for array, where in
                            pickler.new.values()
                            if isinstance(where, Place))
        blocks = dict(self._blocks)
        blocks.update(lent for lent in self._lent.values())
        return stream.getvalue(), {k: blocks[k] for k in pickler.used}

    def _fill(self, shared, arrays):
        """Copy ``arrays`` into the new block ``shared`` and unmap it (only
        its descriptor stays open)."""
        for array, where in arrays.values():
            if isinstance(where, Place):
                _copy(array, shared, where)
        shared.unmap()

    def warning(self):
        """Once, when the arrays copied passed ``COPY_WARN_BYTES``: the
        message of a warning that says so; else None."""
        with self._lock:
            if self._warned or self._copied <= COPY_WARN_BYTES:
                return None
            self._warned = True
            return (
                'the dataset\'s arrays ({:.1f} GiB) were copied into shared '
                'memory for the spawn/forkserver workers, so the process '
                'tree holds them twice (the main process\'s and the '
                'workers\'). To hold them once, make them with '
                'chainiter.shared_copy(array) or chainiter.shared_empty(...) '
                'and drop the originals, load them with numpy.load(path, '
                'mmap_mode=\'r\'), or pass start_method=\'fork\''.format(
                    self._copied / 2 ** 30))

    def release(self):
        with self._lock:
            self._released = True
            blocks, self._blocks = self._blocks, {}
            self._obj = self._pickled = None
            self._lent = {}         # the user's: not ours to release
        for shared in blocks.values():
            shared.release()


def _copy(array, shared, where):
    """Copy ``array`` into block ``shared`` at ``where`` (a ``Place``).
    A contiguous array goes in with ``pwrite``, a step at a time: the
    kernel then copies into the file's pages without a page fault for each
    (half the time of a copy through a mapping, measured for 1 GiB in
    ``/dev/shm``).  The array itself is only read."""
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        view(shared.buffer, where)[...] = array
        return
    data = memoryview(array.reshape(-1, order='A').view(numpy.uint8))
    done = 0
    while done < len(data):
        n = os.pwrite(shared.fd, data[done:done + STEP_BYTES],
                      where.offset + done)
        if n <= 0:
            raise OSError('pwrite wrote nothing')
        done += n


class _Lent(collections.namedtuple('_Lent', 'size fd mapping')):
    """A ``shared_empty`` mapping among a share's blocks."""


class Shipped:
    """The object of ``share`` on its way to a spawned worker, which gets a
    ``Received``.  Pickled only while a process starts (the blocks travel
    as descriptors that multiprocessing hands to the new process)."""

    def __init__(self, share):
        self.share = share

    def __reduce__(self):
        data, blocks = self.share.pickled()
        return Received, (data, {key: (shared.size,
                                       reduction.DupFd(shared.fd))
                                 for key, shared in blocks.items()},
                          self.share.unfilled(blocks))


class Received:
    """In the worker: the pickled object and its blocks' descriptors.
    ``wait``: the blocks are being filled; the worker loads the object only
    after the pool's ``('ready',)`` message."""

    def __init__(self, data, blocks, wait=False):
        self.data = data
        self.blocks = blocks
        self.wait = wait

    def load(self):
        """The object, its large arrays views of the read-only blocks."""
        buffers = {}
        for key, (size, fd) in self.blocks.items():
            shared = SharedBuffer(size, fd.detach(), readonly=True)
            shared.close()      # the mapping stays while the arrays live
            buffers[key] = shared.buffer
        return Unpickler(io.BytesIO(self.data), buffers).load()
