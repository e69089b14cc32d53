"""How many CPUs this process may use: its affinity, and no more than a
cgroup CPU quota (a container's ``--cpus``) gives it time for.

``os.cpu_count()`` and the affinity count every CPU of the host: in a
container limited to 2 CPUs of a 64-CPU host, 64 workers would share the
time of 2.  Nothing here raises: what cannot be read counts as no quota.
"""

import math
import os


def usable_cpus():
    """The CPUs this process may use (at least 1)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        limit = cgroup_cpu_limit()
    except Exception:       # a cgroup file system laid out unlike Linux's
        limit = None
    if limit is not None:
        cpus = min(cpus, math.ceil(limit))
    return max(1, cpus)


def cgroup_cpu_limit(own='/proc/self/cgroup',
                     mountinfo='/proc/self/mountinfo'):
    """The CPUs' worth of time the cgroups of this process may use, the
    least along its hierarchy (cgroup v2's ``cpu.max``, v1's
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``), or None: no quota,
    or none that can be read (not Linux, no cgroup file system).

    ``own`` names each hierarchy's cgroup of this process; ``mountinfo``
    where each hierarchy is mounted, and which of its cgroups is the top
    of the mount (in a container, its own)."""
    lines = _read_lines(own)
    if lines is None:
        return None
    mounts = _cgroup_mounts(mountinfo)
    limits = []
    for line in lines:
        fields = line.split(':', 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == '':                          # v2
            read = _v2_limit
            places = [(root, point) for kind, options, root, point in mounts
                      if kind == 'cgroup2']
        elif 'cpu' in controllers.split(','):          # v1
            read = _v1_limit
            places = [(root, point) for kind, options, root, point in mounts
                      if kind == 'cgroup' and 'cpu' in options]
        else:
            continue
        for root, point in places:
            limits += _along(point, _below(path, root), read)
    return min(limits) if limits else None


def _read_lines(name):
    try:
        with open(name, errors='surrogateescape') as f:
            return f.read().splitlines()
    except OSError:
        return None


def _cgroup_mounts(mountinfo):
    """``(kind, options, root, mount point)`` of each cgroup (v1) or
    cgroup2 file system mounted (proc(5): mountinfo)."""
    mounts = []
    for line in _read_lines(mountinfo) or ():
        before, sep, after = line.partition(' - ')
        fields, rest = before.split(), after.split()
        if not sep or len(fields) < 5 or len(rest) < 3 or \
                rest[0] not in ('cgroup', 'cgroup2'):
            continue
        mounts.append((rest[0], set(rest[2].split(',')),
                       _unescape(fields[3]), _unescape(fields[4])))
    return mounts


def _unescape(field):
    """A mountinfo path: spaces, tabs, newlines and backslashes are
    written as octal escapes (``\\040``)."""
    if '\\' not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == '\\' and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return ''.join(out)


def _below(path, root):
    """``path`` (a cgroup, from the hierarchy's top) as seen under a
    mount of the hierarchy's cgroup ``root``; outside it (another
    namespace's view), the mount's own top."""
    if root in ('', '/'):
        return path
    if path == root or path.startswith(root.rstrip('/') + '/'):
        return path[len(root.rstrip('/')):]
    return '/'


def _along(mount, path, read):
    """The limits read in ``path``'s directory under ``mount`` and in each
    directory above it, up to ``mount``.  (In a container the path may
    name the host's hierarchy, not there: its own limit is at the top.)"""
    limits = []
    parts = [p for p in path.split('/') if p]
    for depth in range(len(parts), -1, -1):
        limit = read(os.path.join(mount, *parts[:depth]))
        if limit is not None:
            limits.append(limit)
    return limits


def _v2_limit(directory):
    try:
        with open(os.path.join(directory, 'cpu.max')) as f:
            quota, period = f.read().split()[:2]
        if quota == 'max':
            return None
        quota, period = int(quota), int(period)
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def _v1_limit(directory):
    try:
        with open(os.path.join(directory, 'cpu.cfs_quota_us')) as f:
            quota = int(f.read())
        with open(os.path.join(directory, 'cpu.cfs_period_us')) as f:
            period = int(f.read())
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period
