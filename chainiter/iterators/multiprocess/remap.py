"""Moving a numpy array's memory into a shared file, and back, in place.

Under spawn and forkserver the large arrays of a dataset are copied into a
shared block that the workers map (share.py).  The main process would then
hold each array twice: its own pages and the block's.  ``adopt`` replaces
the array's own pages by the block's pages at the same addresses
(``mmap`` with ``MAP_FIXED``): the array object, its address and its values
stay, but its memory is now the block's, and the process tree holds the
data once.  ``restore`` undoes it when the workers are gone: the pages go
back to private anonymous memory (a copy moved in with ``mremap``), so that
what the array's allocator later does with the memory (free it, reuse it,
a fork's copy-on-write) works as before.

Only the whole pages inside the array move; its first and last partial
pages stay private (they may share a page with other objects).  Linux only:
elsewhere ``available()`` is False and the arrays are copied as before.
"""

import ctypes
import mmap
import os
import sys
import threading

import numpy

PAGE = mmap.PAGESIZE

#: Arrays are copied and moved this many bytes at a time, so that the main
#: process never holds much of an array twice.
STEP_BYTES = 64 * 2 ** 20

_PROT_READ_WRITE = 0x1 | 0x2
_MAP_SHARED = 0x01
_MAP_PRIVATE = 0x02
_MAP_FIXED = 0x10
_MAP_ANONYMOUS = 0x20
_MREMAP_MAYMOVE = 1
_MREMAP_FIXED = 2
_FALLOC_PUNCH_HOLE = 0x01 | 0x02        # with FALLOC_FL_KEEP_SIZE
_FAILED = ctypes.c_void_p(-1).value

_libc = None

# The regions of this process now in shared files: start -> length.
_moved = {}
_lock = threading.Lock()


def available():
    """Whether arrays can be moved in place here (Linux, libc's mmap)."""
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith('linux'):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.mmap.restype = ctypes.c_void_p
                libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t,
                                      ctypes.c_int, ctypes.c_int,
                                      ctypes.c_int, ctypes.c_long)
                libc.mremap.restype = ctypes.c_void_p
                libc.mremap.argtypes = (ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_size_t, ctypes.c_int,
                                        ctypes.c_void_p)
                libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
                libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int,
                                           ctypes.c_long, ctypes.c_long)
                _libc = libc
            except (OSError, AttributeError):
                pass
    return bool(_libc)


def pages(address, nbytes):
    """``(start, length)`` of the whole pages inside ``nbytes`` bytes at
    ``address``; length 0 when there are none."""
    start = -(-address // PAGE) * PAGE
    end = (address + nbytes) // PAGE * PAGE
    return start, max(end - start, 0)


def movable(array):
    """``(address, nbytes)`` of ``array``'s memory when it can move: a
    contiguous ndarray whose memory numpy allocated (the array, or the
    arrays it views, own it: not a memmap, a buffer or shared memory),
    with whole pages inside that are not moved already; else None."""
    if not (array.flags.c_contiguous or array.flags.f_contiguous) or \
            not available():
        return None
    base = array
    while base.base is not None:
        base = base.base
        if type(base) is not numpy.ndarray:
            return None
    if not base.flags.owndata:
        return None
    address = array.__array_interface__['data'][0]
    start, length = pages(address, array.nbytes)
    if not length:
        return None
    with _lock:
        for other, other_length in _moved.items():
            if other < start + length and start < other + other_length:
                return None
    return address, array.nbytes


def copy_in(address, nbytes, fd, offset):
    """Copy the ``nbytes`` bytes at ``address`` into file ``fd`` at offset
    ``offset`` (which is ``address`` modulo the page size) and move their
    whole pages there (``adopt``), a step at a time.  The pages moved are
    registered under their start (``pages``) as they move, for
    ``give_back``; when moving fails the rest is only copied.  Raises
    OSError when the file cannot take the bytes.

    The bytes go in with ``pwrite``, not through a mapping of the file:
    the kernel then copies into the file's pages without a page fault
    for each (half the time, measured for 1 GiB in ``/dev/shm``)."""
    start, length = pages(address, nbytes)
    done = min(start - address, nbytes)          # bytes copied
    write_at(fd, address, done, offset)
    moved = 0
    with _lock:
        try:
            while moved < length:
                step = min(STEP_BYTES, length - moved)
                write_at(fd, address + done, step, offset + done)
                done += step
                # Registered first: an interrupt leaves no moved page
                # unregistered (giving back a page not moved is harmless).
                _moved[start] = moved + step
                adopt(start + moved, step, fd, offset + done - step)
                moved += step
        except OSError:
            if moved:
                _moved[start] = moved
            else:
                _moved.pop(start, None)
    write_at(fd, address + done, nbytes - done, offset + done)


def write_at(fd, address, nbytes, offset):
    """``pwrite`` the ``nbytes`` bytes at ``address`` to file ``fd`` at
    ``offset``, all of them.  Raises OSError."""
    while nbytes > 0:
        step = min(nbytes, STEP_BYTES)
        n = os.pwrite(fd, (ctypes.c_char * step).from_address(address),
                      offset)
        if n <= 0:
            raise OSError('pwrite wrote nothing')
        address += n
        offset += n
        nbytes -= n


def adopt(start, length, fd, offset):
    """Map ``length`` bytes of file ``fd`` from ``offset`` (both page
    aligned) shared at ``start``, over what was there.  The file must hold
    what the memory holds: the values do not change.  Raises OSError."""
    got = _libc.mmap(start, length, _PROT_READ_WRITE,
                     _MAP_SHARED | _MAP_FIXED, fd, offset)
    if got in (None, _FAILED) or got != start:
        _raise('mmap')


def give_back(start, fd=-1, offset=0, owner=None):
    """Make the pages moved at ``start`` private anonymous memory again,
    with their values, a step at a time; with ``fd``, the file's pages
    they were (from ``offset``) are freed as they go (no process may map
    them any more).  Nothing when they are back already.  When that fails
    (no memory for the copy) what is left stays registered (the next fork
    tries again) and ``owner``, the array, is kept alive for good: its
    allocator must never reuse shared pages for other objects."""
    with _lock:
        _give_back(start, fd, offset, owner)


# Arrays whose pages could not be given back: never freed.
_stuck = []


def _give_back(start, fd=-1, offset=0, owner=None):
    # give_back, under _lock.
    length = _moved.pop(start, 0)
    done = 0
    try:
        while done < length:
            step = min(STEP_BYTES, length - done)
            restore(start + done, step)
            if fd >= 0:
                _libc.fallocate(fd, _FALLOC_PUNCH_HOLE, offset + done, step)
            done += step
    except OSError:
        # Left in the file (which stays while mapped): the values are
        # right, only the pages are not private.
        _moved[start + done] = length - done
        if owner is not None:
            _stuck.append(owner)


# Whether _before_fork holds _lock (for the fork's after hooks to release).
_held_for_fork = False


def _before_fork():
    """Before the process forks: every moved region given back (a forked
    child must get a copy-on-write copy of the arrays, not share them),
    and no move until the fork is done: ``_lock`` is held through it (a
    thread that moves arrays meanwhile, a worker starting, waits) and
    released by ``_after_fork`` in the parent and in the child."""
    global _held_for_fork
    _lock.acquire()
    _held_for_fork = True
    for start in list(_moved):
        _give_back(start)


def _after_fork():
    global _held_for_fork
    if _held_for_fork:
        _held_for_fork = False
        _lock.release()


# Registered at import, before forks.py's hooks (it imports this module
# first): the after hooks run in that order, so _lock is released before
# forks.py waits for a pool's lock, which a thread that moves arrays may
# hold while it waits for _lock.
if hasattr(os, 'register_at_fork'):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork,
                        after_in_child=_after_fork)


def restore(start, length):
    """Make the ``length`` bytes at ``start`` private anonymous memory
    again, with the values they hold.  Raises OSError (the memory then
    stays as it was)."""
    copy = _libc.mmap(None, length, _PROT_READ_WRITE,
                      _MAP_PRIVATE | _MAP_ANONYMOUS, -1, 0)
    if copy in (None, _FAILED):
        _raise('mmap')
    ctypes.memmove(copy, start, length)
    got = _libc.mremap(copy, length, length,
                       _MREMAP_MAYMOVE | _MREMAP_FIXED, start)
    if got in (None, _FAILED) or got != start:
        _libc.munmap(copy, length)
        _raise('mremap')


def _raise(call):
    errno = ctypes.get_errno()
    raise OSError(errno, '{} failed: {}'.format(call, os.strerror(errno)))
