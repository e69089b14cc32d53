"""The CPUs the iterators count on: affinity, and a cgroup CPU quota (a
container's ``--cpus``), read from a cgroup file system laid out in a
temporary directory as Linux lays it out."""

import os

from chainiter._cpus import cgroup_cpu_limit, usable_cpus


def _tree(tmp_path, own, files):
    (tmp_path / 'own').write_text(own)
    for name, text in files.items():
        path = tmp_path / 'fs' / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path / 'fs'), str(tmp_path / 'own')


def test_a_v2_quota_is_the_least_along_the_hierarchy(tmp_path):
    root, own = _tree(tmp_path, '0::/user.slice/job\n', {
        'user.slice/job/cpu.max': 'max 100000\n',
        'user.slice/cpu.max': '150000 100000\n',
        'cpu.max': '400000 100000\n',
    })
    assert cgroup_cpu_limit(root, own) == 1.5


def test_a_container_finds_its_quota_at_the_top(tmp_path):
    """Inside a container the path may name the host's hierarchy, which
    is not mounted there; the container's own limit is at the top."""
    root, own = _tree(tmp_path, '0::/docker/abc\n', {
        'cpu.max': '200000 100000\n',
    })
    assert cgroup_cpu_limit(root, own) == 2.0


def test_a_v1_quota(tmp_path):
    root, own = _tree(tmp_path, (
        '4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n'), {
        'cpu,cpuacct/docker/abc/cpu.cfs_quota_us': '300000\n',
        'cpu,cpuacct/docker/abc/cpu.cfs_period_us': '100000\n',
        'cpu,cpuacct/cpu.cfs_quota_us': '-1\n',
        'cpu,cpuacct/cpu.cfs_period_us': '100000\n',
    })
    assert cgroup_cpu_limit(root, own) == 3.0


def test_no_quota(tmp_path):
    root, own = _tree(tmp_path, '1:cpu:/\n0::/a\n', {
        'cpu/cpu.cfs_quota_us': '-1\n',
        'cpu/cpu.cfs_period_us': '100000\n',
        'a/cpu.max': 'max 100000\n',
    })
    assert cgroup_cpu_limit(root, own) is None
    assert cgroup_cpu_limit(root, str(tmp_path / 'no such file')) is None


def test_usable_cpus_is_at_most_the_affinity():
    cpus = usable_cpus()
    assert 1 <= cpus
    if hasattr(os, 'sched_getaffinity'):
        assert cpus <= len(os.sched_getaffinity(0))
