"""Shared-memory buffers that worker processes write examples into.

A ``SharedBuffer`` is what ``multiprocessing.sharedctypes`` is built on: a
file in ``/dev/shm`` (or, when that lacks room, Python's temporary directory),
unlinked as soon as it is created, kept open and mapped with ``mmap``.  Since
the file has no name, nothing is left behind even if every process is
killed.  Two things differ from a ``RawArray``:

- the blocks are reserved with ``posix_fallocate`` when the buffer is made,
  so a full ``/dev/shm`` is an error (or a fallback with a warning) at
  allocation, never a Bus error when a page is first written;
- its file descriptor can be passed to a worker at any time (over the
  worker's pipe, ``multiprocessing.reduction.send_handle``), not only while
  the worker starts, so buffers sized from the first batch can be handed to
  workers that are already running.

The files, the room for them and the reserving of their pages are
``shm_files.py``.
"""

import ctypes
import errno
import mmap
import os
import sys
import tempfile
import threading
import warnings
import weakref

import numpy

from chainiter._interrupts import uninterrupted
from chainiter.errors import SharedMemoryWarning
# reserve_pages is imported from here by worker.py.
from chainiter.iterators.pipeline.memory.shm_files import (
    SHM_DIR, create_file, free_bytes, reserve_pages, size_text, unreserved)

# mmap's flag that maps every page at once (Linux; Python 3.10 names it).
_MAP_POPULATE = getattr(mmap, 'MAP_POPULATE',
                        0x8000 if sys.platform.startswith('linux') else 0)


# The live buffers by id() of their mmap, for SharedBuffer.of().
_by_mapping = weakref.WeakValueDictionary()


def _directories():
    """Where a buffer may go, in order.  The temporary directory is looked
    up only when ``/dev/shm`` had no room: Python's first look-up opens
    files, and with ``ulimit -n`` used up it fails as "No usable temporary
    directory" where the error to tell is the limit's (EMFILE)."""
    if os.path.isdir(SHM_DIR):
        yield SHM_DIR
    yield tempfile.gettempdir()


class SharedBuffer:
    """``size`` bytes of memory shared with worker processes.

    ``buffer`` is the writable ``mmap``.  Created in the parent with
    ``SharedBuffer.allocate(size)``; a worker that receives the descriptor
    maps the same memory with ``SharedBuffer(size, fd)``, or with
    ``readonly=True`` only for reading (numpy arrays that view it are then
    not writeable, and the kernel refuses writes too); ``populate=True``
    maps all its pages at once (where the OS can), not at first touch.
    """

    def __init__(self, size, fd, readonly=False, populate=False):
        self.size = size
        self.fd = fd
        self.directory = None       # where allocate() put the file
        self.buffer = None
        if size:
            if readonly:
                self.buffer = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            elif populate and _MAP_POPULATE:
                self.buffer = mmap.mmap(fd, size,
                                        mmap.MAP_SHARED | _MAP_POPULATE)
            else:
                self.buffer = mmap.mmap(fd, size)
        self._on_release = []           # None once released
        self._release_lock = threading.Lock()
        if self.buffer is not None:
            _by_mapping[id(self.buffer)] = self

    @staticmethod
    def of(array):
        """The live SharedBuffer that the numpy ``array`` (a batch handed
        out by a MultiprocessIterator) views, or None."""
        base = array
        while isinstance(base, numpy.ndarray):
            base = base.base
        if not isinstance(base, ctypes.Array):
            return None
        for owner in (getattr(base, '_objects', None) or {}).values():
            mapping = getattr(owner, 'obj', None)    # memoryview of the mmap
            shared = _by_mapping.get(id(mapping))
            if shared is not None and shared.buffer is mapping:
                return shared
        return None

    def region(self):
        """``(address, nbytes)`` of the mapping, or None once released."""
        mapping = self.buffer
        if mapping is None:
            return None
        whole = (ctypes.c_char * self.size).from_buffer(mapping)
        return ctypes.addressof(whole), self.size

    def when_released(self, callback):
        """Have ``release()`` call ``callback()`` before the memory may be
        unmapped (a GPU's registration of it must end first); False, and
        no call, when it was released already."""
        with self._release_lock:
            if self._on_release is None:
                return False
            self._on_release.append(callback)
            return True

    @classmethod
    def allocate(cls, size, reserve=True):
        """A new buffer of ``size`` bytes, in ``/dev/shm`` or else in the
        temporary directory.  Its pages are reserved (a full file system
        raises here, not SIGBUS at a write), or, without ``reserve``,
        later (0.25 s a GiB), by ``reserve()`` or by the process that
        writes into it (a worker, for a slot), before it writes."""
        size = max(int(size), 1)
        tried = []
        for directory in _directories():
            free = free_bytes(directory)
            try:
                fd = create_file(directory, size, reserve)
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                    raise
                tried.append((directory, free))
                continue
            try:
                shared = cls(size, fd)
                shared.directory = directory
                if not reserve:
                    unreserved.add(shared)
            except OSError as e:
                os.close(fd)
                if e.errno != errno.ENOMEM:
                    raise
                raise MemoryError(
                    'cannot map {} of shared memory: the address space is '
                    'exhausted (ulimit -v / RLIMIT_AS?). Raise the limit, or '
                    'lower n_prefetch, batch_size or shared_mem'.format(
                        size_text(size))) from e
            if tried:
                try:
                    warnings.warn(
                        'shared-memory buffers of {} do not fit in {} ({} '
                        'free), so they were placed in {}, which may be '
                        'slower. Enlarge /dev/shm (e.g. docker run '
                        '--shm-size=..., or mount -o remount,size=... '
                        '/dev/shm) or lower n_prefetch, batch_size or '
                        'shared_mem'.format(
                            size_text(size), tried[0][0],
                            size_text(tried[0][1]), directory),
                        SharedMemoryWarning, stacklevel=4)
                except BaseException:     # the warning is an error here
                    shared.release()
                    raise
            return shared
        raise MemoryError(
            'no room for {} of shared-memory buffers: {}. Enlarge /dev/shm '
            '(e.g. docker run --shm-size=...) or the temporary directory '
            '(TMPDIR), or lower n_prefetch, batch_size or shared_mem'.format(
                size_text(size), ', '.join(
                    '{} has {} free'.format(d, size_text(f))
                    for d, f in tried)))

    @classmethod
    def private(cls, size, reserve=False):
        """A buffer of ``size`` bytes of this process's own memory (no
        file: for worker threads, which share the address space).  Private
        to the process, so a forked child gets a copy of its own: what is
        written later is not seen there."""
        self = cls(0, -1)
        self.size = max(int(size), 1)
        try:
            self.buffer = mmap.mmap(-1, self.size, mmap.MAP_PRIVATE)
        except OSError as e:
            if e.errno != errno.ENOMEM:
                raise
            raise MemoryError(
                'cannot allocate {} for a batch buffer ({}). Lower '
                'n_prefetch or batch_size'.format(size_text(self.size), e)
            ) from e
        _by_mapping[id(self.buffer)] = self
        return self

    def reserve(self):
        """Reserve the pages of a buffer that ``allocate(reserve=False)``
        made.  Raises MemoryError when the file system has no room any
        more (then writing into the buffer would raise SIGBUS)."""
        reason = reserve_pages(self.fd, self.size)
        if reason is not None:
            raise MemoryError(
                'no room for {} of shared memory in {} ({}; {} free): it '
                'was there a moment ago, and something else took it. '
                'Enlarge /dev/shm (e.g. docker run --shm-size=...) or the '
                'temporary directory (TMPDIR)'.format(
                    size_text(self.size), self.directory, reason,
                    size_text(free_bytes(self.directory))))

    def close(self):
        """Close the descriptor.  The mapping stays for as long as this
        object or an array viewing it lives."""
        with uninterrupted():
            fd, self.fd = self.fd, -1
            if fd >= 0:
                os.close(fd)

    def unmap(self):
        """Close the mapping now and keep the descriptor, to pass on to
        processes started later.  No array may view the mapping."""
        buffer, self.buffer = self.buffer, None
        if buffer is not None:
            _by_mapping.pop(id(buffer), None)
            buffer.close()

    def release(self):
        """Close the descriptor and the mapping now (no more hand-outs will
        come from it).  Arrays that still view it keep the memory valid:
        the mapping then goes with the last of them.  Called again, it does
        nothing."""
        with uninterrupted():
            self.close()
            buffer, self.buffer = self.buffer, None
            if buffer is not None:
                _by_mapping.pop(id(buffer), None)
            with self._release_lock:
                callbacks, self._on_release = self._on_release or [], None
            for callback in callbacks:
                callback()
            if buffer is not None:
                try:
                    buffer.close()  # also closes mmap's own descriptor
                except BufferError:
                    pass            # viewed by arrays the user holds
