"""Whether the process has room for one more shared-memory slot: file
descriptors (``ulimit -n``) and address space (``ulimit -v``).  The
slots (``slots.py``) check before they allocate one, and the iterator
keeps its depth within the descriptors left."""

import errno
import os

from chainiter.iterators.pipeline.flow.depth import SPARE_DESCRIPTORS


# What a new slot must leave free of ``ulimit -n`` (``depth.py``'s
# SPARE_DESCRIPTORS) and of ``ulimit -v`` (for the batches that then come
# by copy, and everything else).

# The errors of a process (EMFILE: ``ulimit -n``) or a system (ENFILE)
# without a descriptor to spare.
DESCRIPTOR_ERRNOS = (errno.EMFILE, errno.ENFILE)
_SPARE_ADDRESS_SPACE = 64 * 2 ** 20


def descriptor_room():
    """How many more files this process may open (``ulimit -n``), or
    None when there is no limit or it cannot be read."""
    try:
        import resource
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        return soft - len(os.listdir('/proc/self/fd'))
    except OSError as e:
        # Listing takes a descriptor: none left is what it would say.
        return 0 if e.errno in DESCRIPTOR_ERRNOS else soft


def check_room(size):
    """OSError(EMFILE) or MemoryError when one more slot of ``size`` bytes
    would leave less than the spares of the process's limits."""
    try:
        import resource
    except ImportError:
        return
    left = descriptor_room()
    if left is not None and left < SPARE_DESCRIPTORS + 2:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        raise OSError(errno.EMFILE, 'only {} file descriptors are left '
                      '(ulimit -n is {})'.format(left, soft))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            with open('/proc/self/status') as f:
                used = next(int(line.split()[1]) * 1024 for line in f
                            if line.startswith('VmSize:'))
        except (OSError, StopIteration, ValueError):
            return
        if soft - used < size + _SPARE_ADDRESS_SPACE:
            raise MemoryError(
                'only {} MiB of address space are left (ulimit -v / '
                'RLIMIT_AS)'.format((soft - used) // 2 ** 20))
