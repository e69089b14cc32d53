"""The benchmark runs (smoke mode); its figures are not checked here."""

import subprocess
import sys

import pytest


@pytest.mark.timeout(300)
def test_bench_smoke_prints_the_table():
    out = subprocess.run(
        [sys.executable, '-m', 'chainiter.bench', '--smoke'],
        capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr
    assert 'memcpy bandwidth' in out.stderr
    rows = [line for line in out.stdout.splitlines()
            if line.startswith('| ') and 'workload' not in line]
    workloads = {row.split('|')[1].strip() for row in rows}
    assert workloads == {'images', 'tiny', 'cpu', 'variable'}
    loaders = {row.split('|')[3].strip() for row in rows}
    assert loaders == {'chainiter', 'chainiter-list', 'serial'}


def test_bench_user_dataset():
    out = subprocess.run(
        [sys.executable, '-m', 'chainiter.bench', '--smoke', '--workloads',
         '', '--dataset', 'chainiter.bench.workloads:Tiny',
         '--batch-size', '8', '--loaders', 'chainiter:4,serial'],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split('|') for line in out.stdout.splitlines()
            if line.startswith('| ') and not line.startswith('| workload |')]
    assert {row[1].strip() for row in rows} == {
        'chainiter.bench.workloads:Tiny'}
    assert {row[3].strip() for row in rows} == {'chainiter:4', 'serial'}
