"""The scaling benchmark runs, and refuses bad arguments before running."""

import subprocess
import sys

import pytest


def scale(*args):
    return subprocess.run(
        [sys.executable, '-m', 'chainiter.bench.scale'] + list(args),
        capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(150)
def test_prints_a_row_per_size():
    done = scale('--sizes', '32768,65536', '--repeats', '1')
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines()
            if line.startswith('chainiter |')]
    assert [row.split(' | ')[1] for row in rows] == ['3e+04', '7e+04']
    # A seeded order is not stored: the snapshot is a few KiB at any size.
    assert all(row.split(' | ')[9].endswith('KiB') for row in rows), rows


@pytest.mark.parametrize('args, message', [
    (['--sizes', '1e6,abc'], 'sizes are whole numbers'),
    (['--sizes', '100'], 'at least 32768'),
    (['--repeats', '0'], 'at least 1'),
])
def test_bad_arguments_fail_before_anything_runs(args, message):
    done = scale(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert 'chainiter |' not in done.stdout and 'loader' not in done.stdout
