"""How many CPUs this process may use: its affinity, and no more than a
cgroup CPU quota (a container's ``--cpus``) gives it time for.

``os.cpu_count()`` and the affinity count every CPU of the host: in a
container limited to 2 CPUs of a 64-CPU host, 64 workers would share the
time of 2.
"""

import math
import os


def usable_cpus():
    """The CPUs this process may use (at least 1)."""
    if hasattr(os, 'sched_getaffinity'):
        cpus = len(os.sched_getaffinity(0))
    else:
        cpus = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        cpus = min(cpus, math.ceil(limit))
    return max(1, cpus)


def cgroup_cpu_limit(root='/sys/fs/cgroup', own='/proc/self/cgroup'):
    """The CPUs' worth of time the cgroups of this process may use, the
    least along its hierarchy (cgroup v2's ``cpu.max``, v1's
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``), or None: no quota,
    or none that can be read (not Linux, no cgroup file system)."""
    try:
        with open(own) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(':', 2)
        if controllers == '':                      # v2
            limits += _along(root, path, _v2_limit)
        elif 'cpu' in controllers.split(','):      # v1
            limits += _along(os.path.join(root, controllers), path,
                             _v1_limit)
    return min(limits) if limits else None


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
        return int(quota) / int(period)
    except (OSError, ValueError):
        return None


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
