"""The CPUs the iterators count on: affinity, and a cgroup CPU quota (a
container's ``--cpus``), read from cgroup file systems laid out in a
temporary directory as Linux lays them out, with the ``/proc/self/cgroup``
and ``/proc/self/mountinfo`` that name them."""

import os

from chainiter._cpus import cgroup_cpu_limit, usable_cpus


def _tree(tmp_path, own, mounts, files):
    """``mounts``: (kind, super options, root of the mount, mount point
    under the temporary directory)."""
    fs = tmp_path / 'fs'
    (tmp_path / 'own').write_bytes(own.encode('utf-8', 'surrogateescape'))
    (tmp_path / 'mountinfo').write_text(''.join(
        '{} 1 0:{} {} {} rw,relatime - {} {} {}\n'.format(
            30 + i, 30 + i, root, fs / point, kind, kind, options)
        for i, (kind, options, root, point) in enumerate(mounts)))
    for name, text in files.items():
        path = fs / os.fsencode(name).decode('utf-8', 'surrogateescape')
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path / 'own'), str(tmp_path / 'mountinfo')


V2 = [('cgroup2', 'rw', '/', 'unified')]


def test_a_v2_quota_is_the_least_along_the_hierarchy(tmp_path):
    own, mounts = _tree(tmp_path, '0::/user.slice/job\n', V2, {
        'unified/user.slice/job/cpu.max': 'max 100000\n',
        'unified/user.slice/cpu.max': '150000 100000\n',
        'unified/cpu.max': '400000 100000\n',
    })
    assert cgroup_cpu_limit(own, mounts) == 1.5


def test_a_container_finds_its_quota_at_the_top(tmp_path):
    """With its own cgroup namespace the path may name the host's
    hierarchy, which is not mounted there: its limit is at the top."""
    own, mounts = _tree(tmp_path, '0::/docker/abc\n', V2, {
        'unified/cpu.max': '200000 100000\n',
    })
    assert cgroup_cpu_limit(own, mounts) == 2.0


def test_a_v1_quota_where_the_hierarchy_is_mounted(tmp_path):
    """The mount point need not be named after the controllers, and a
    container without its own namespace sees its cgroup as the mount's
    root: a sub-cgroup's tighter quota counts."""
    own, mounts = _tree(
        tmp_path, '4:memory:/x\n3:cpu,cpuacct:/docker/abc/sub\n0::/\n',
        [('cgroup', 'rw,cpu,cpuacct', '/docker/abc', 'cpu'),
         ('cgroup', 'rw,memory', '/', 'memory')], {
            'cpu/sub/cpu.cfs_quota_us': '100000\n',
            'cpu/sub/cpu.cfs_period_us': '100000\n',
            'cpu/cpu.cfs_quota_us': '400000\n',
            'cpu/cpu.cfs_period_us': '100000\n',
            'memory/cpu.cfs_quota_us': '50000\n',     # not the cpu controller
            'memory/cpu.cfs_period_us': '100000\n',
        })
    assert cgroup_cpu_limit(own, mounts) == 1.0


def test_no_quota_and_what_cannot_be_read(tmp_path):
    own, mounts = _tree(
        tmp_path, '\nnonsense\n1:cpu:/caf\udce9\n0::/a\n',
        [('cgroup', 'rw,cpu', '/', 'cpu')] + V2, {
            'cpu/caf\udce9/cpu.cfs_quota_us': '-1\n',
            'cpu/caf\udce9/cpu.cfs_period_us': '100000\n',
            'unified/a/cpu.max': 'max 100000\n',
            'unified/cpu.max': '100000 0\n',
        })
    assert cgroup_cpu_limit(own, mounts) is None
    assert cgroup_cpu_limit(str(tmp_path / 'none'), mounts) is None
    assert cgroup_cpu_limit(own, str(tmp_path / 'none')) is None


def test_a_cgroup_name_that_is_not_utf8(tmp_path):
    own, mounts = _tree(tmp_path, '1:cpu:/caf\udce9\n',
                        [('cgroup', 'rw,cpu', '/', 'cpu')], {
                            'cpu/caf\udce9/cpu.cfs_quota_us': '50000\n',
                            'cpu/caf\udce9/cpu.cfs_period_us': '100000\n',
                        })
    assert cgroup_cpu_limit(own, mounts) == 0.5


def test_usable_cpus_is_at_most_the_affinity():
    cpus = usable_cpus()
    assert 1 <= cpus
    if hasattr(os, 'sched_getaffinity'):
        assert cpus <= len(os.sched_getaffinity(0))
