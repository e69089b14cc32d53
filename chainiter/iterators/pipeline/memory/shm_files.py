"""The unlinked files behind shared buffers (shm.py): making one in
``/dev/shm`` or another directory (``create_file``) when the room there
fits it, counting what the buffers made without reserving may still take
(``unreserved``), and reserving a file's pages (``reserve_pages``)."""

import errno
import os
import tempfile
import threading
import weakref

SHM_DIR = '/dev/shm'


def free_bytes(directory):
    try:
        st = os.statvfs(directory)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


class _Unreserved:
    """The live buffers made without reserving their pages: the room they
    may still take is not free for the next buffer (``_outstanding``).
    Any thread adds to it (each iterator makes its slots in its own), and
    a buffer leaves it when it is freed, in whatever thread frees it; so
    the weak references are kept under a lock and counted from a copy (a
    ``WeakSet`` raised "Set changed size during iteration" when another
    thread added to it meanwhile).  Each ``add`` drops the dead (a few
    dozen slots live: far less than the making of a buffer costs), so it
    never grows without bound."""

    def __init__(self):
        self._lock = threading.Lock()
        self._refs = []

    def add(self, shared):
        ref = weakref.ref(shared)
        with self._lock:
            self._refs = [r for r in self._refs if r() is not None]
            self._refs.append(ref)

    def new_lock(self):
        self._lock = threading.Lock()

    def live(self):
        with self._lock:
            refs = list(self._refs)
        return [s for s in (r() for r in refs) if s is not None]


unreserved = _Unreserved()
if hasattr(os, 'register_at_fork'):
    # A fork while another thread held the lock: the child's is free (the
    # buffers the child inherited still take their room).
    os.register_at_fork(after_in_child=unreserved.new_lock)


def _limited(directory):
    """False for a file system without a size (a tmpfs mounted with
    ``size=0``: statvfs says 0 bytes free, and any size fits)."""
    try:
        return os.statvfs(directory).f_blocks > 0
    except OSError:
        return True


def _outstanding(directory):
    """The bytes that live buffers in ``directory`` made without
    reserving may still take there (their size less what they hold)."""
    total = 0
    for shared in unreserved.live():
        fd = shared.fd
        if fd < 0 or shared.directory != directory:
            continue
        try:
            total += max(0, shared.size - os.fstat(fd).st_blocks * 512)
        except OSError:
            pass
    return total


def _room(directory):
    """The bytes free in ``directory`` for a buffer made without
    reserving: free now, less what the others may still take.  Those are
    measured first: a worker that reserves one of them in between has its
    pages counted twice (too little room), never not at all.  (Free bytes
    read first, and then a buffer that a worker had reserved meanwhile,
    lost its pages from both: a slot went to a /dev/shm without room for
    it, in 1 run of 36 of a test.)  Measured again, a few times, while a
    reservation changed what the others may take."""
    outstanding = _outstanding(directory)
    for _ in range(3):
        room = free_bytes(directory) - outstanding
        again = _outstanding(directory)
        if again == outstanding:
            break
        outstanding = again
    return room


def reserve_pages(fd, size):
    """Reserve the pages of the first ``size`` bytes of file ``fd``, so
    that writing into a mapping of them cannot raise SIGBUS.  None, or the
    reason (a string) when the file system has no room for them (ENOSPC,
    EDQUOT, EFBIG; ENOMEM on a tmpfs under memory pressure).  Nothing
    where nothing reserves (no posix_fallocate: macOS; a file system
    that cannot)."""
    if not hasattr(os, 'posix_fallocate'):
        return None
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            return None
        return os.strerror(e.errno) if e.errno else str(e)
    return None


def create_file(directory, size, reserve=True):
    """An unlinked file of ``size`` reserved bytes in ``directory``; raises
    OSError(ENOSPC) when it does not fit.  Without ``reserve`` the file
    only has its size (its pages come with the writes) and "fits" means
    that the file system has the bytes free now, less what the other
    buffers made so may still take.

    With O_TMPFILE the file never has a name: nothing can be left behind,
    not even by an interrupt between creating and unlinking it."""
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_RDWR, 0o600)
    except (AttributeError, OSError) as e:
        if isinstance(e, OSError) and e.errno not in (
                errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
        # No O_TMPFILE here (another OS, an old kernel or filesystem).
        fd, name = tempfile.mkstemp(prefix='chainiter-', dir=directory)
        os.unlink(name)
    try:
        if reserve and hasattr(os, 'posix_fallocate'):
            os.posix_fallocate(fd, 0, size)
        elif _limited(directory) and _room(directory) < size:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        else:
            os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def size_text(n):
    return '{:,} bytes ({:.1f} MiB)'.format(n, n / 2 ** 20)
