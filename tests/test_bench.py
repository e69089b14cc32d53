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
    assert workloads == {'images', 'tiny', 'tiny-batched', 'cpu',
                         'variable', 'bucketed'}
    loaders = {row.split('|')[3].strip() for row in rows}
    assert loaders == {'chainiter', 'chainiter-list', 'serial'}


def test_bench_user_dataset():
    out = subprocess.run(
        [sys.executable, '-m', 'chainiter.bench', '--smoke', '--workloads',
         '', '--dataset', 'chainiter.bench.workloads:Tiny',
         '--batch-size', '8', '--loaders', 'chainiter:4,serial,serial'],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split('|') for line in out.stdout.splitlines()
            if line.startswith('| ') and not line.startswith('| workload |')]
    assert {row[1].strip() for row in rows} == {
        'chainiter.bench.workloads:Tiny'}
    # A loader named twice (or also given as --compare) runs once.
    assert sorted(row[3].strip() for row in rows) == ['chainiter:4',
                                                      'serial']


def test_table_compares_like_with_like():
    from chainiter.bench.__main__ import format_table

    def run(rate):
        return [{'examples_per_s': rate, 'first_batch_s': 0.1,
                 'peak_pss_bytes': 2 ** 20}]
    results = {('tiny', 2, 'chainiter'): run(800.0),
               ('tiny', 2, 'chainiter:16'): run(1200.0),
               ('tiny', 2, 'torch'): run(100.0),
               ('tiny', 2, 'torch:16'): run(200.0),
               ('tiny', 2, 'serial'): run(400.0)}
    loaders = ['chainiter', 'chainiter:16', 'serial', 'torch', 'torch:16']
    table = format_table(results, ['tiny'], [2], loaders, 1e9)
    rows = {line.split('|')[3].strip(): line.split('|')[5].strip()
            for line in table.splitlines()[2:]}
    assert rows['chainiter'] == '8.00x'       # against torch
    assert rows['chainiter:16'] == '6.00x'    # against torch:16
    assert rows['serial'] == '4.00x'


def test_memory_is_summed_over_the_worker_processes():
    import os

    import chainiter
    from chainiter.bench import runner

    from helpers import Pids
    with chainiter.MultiprocessIterator(Pids(), 12, n_processes=2,
                                        shuffle=False) as it:
        pids = {example[1] for example in next(it)}
        found = set(runner._descendants(os.getpid()))
        assert pids | {os.getpid()} <= found
        assert found == set(runner._descendants_by_scan(os.getpid()))


def run_bench(*args, timeout=60):
    return subprocess.run([sys.executable, '-m', 'chainiter.bench'] +
                          list(args), capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize('args, names', [
    (['--dataset', 'mymodule'], ['mymodule', 'module:function']),
    (['--dataset', 'chainiter.bench.workloads:NoSuch'],
     ['NoSuch', 'module:function']),
    (['--dataset', 'no_such_module_for_chainiter:make'],
     ['no_such_module_for_chainiter']),
    (['--workloads', 'tiny,nosuch'], ['nosuch', 'images, tiny']),
    (['--loaders', 'chainiter,nosuch'], ['nosuch', 'chainiter-list']),
    (['--loaders', 'serial:4'], ['serial:4', 'NAME:K']),
    (['--loaders', 'chainiter:x'], ['chainiter:x', 'NAME:K']),
    (['--workers', '2,x'], ['2,x', '1,2,4']),
    (['--workers', '0'], ["'0'", '1,2,4']),
    (['--workloads', ''], ['nothing to run', '--dataset'])])
def test_bench_argument_errors_stop_before_anything_runs(args, names):
    out = run_bench('--smoke', *args)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ''            # no table
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and 'memcpy' not in out.stderr, out.stderr
    assert lines[0].startswith('python -m chainiter.bench: error: ')
    for name in names:
        assert name in lines[0]


def test_bench_user_dataset_alone_runs_only_that_dataset():
    out = run_bench('--smoke', '--dataset', 'chainiter.bench.workloads:Tiny',
                    '--batch-size', '8', '--loaders', 'serial')
    assert out.returncode == 0, out.stderr
    rows = [line.split('|') for line in out.stdout.splitlines()
            if line.startswith('| ') and not line.startswith('| workload |')]
    assert [row[1].strip() for row in rows] == [
        'chainiter.bench.workloads:Tiny']


def test_bench_help_shows_the_defaults():
    out = run_bench('--help', timeout=30)
    assert out.returncode == 0, out.stderr
    text = ' '.join(out.stdout.split())     # undo argparse's wrapping
    assert '(default: 2)' in text                               # --workers
    assert '(default: chainiter,chainiter-list,serial)' in text  # --loaders
    assert '(default: 3)' in text                               # --repeats
    assert '(default: 3.0)' in text                             # --seconds
    assert 'none when --dataset is given' in text


def test_tiny_batched_is_tiny_with_a_batch_method():
    import numpy

    from chainiter import concat_examples
    from chainiter.bench import workloads
    from helpers import fingerprint
    tiny, batched = workloads.Tiny(100), workloads.tiny_batched(100)
    assert batched.get_examples is not None
    indices = [5, 99, 0, 42]
    expected = fingerprint(concat_examples([tiny[i] for i in indices]))
    assert fingerprint(concat_examples([batched[i] for i in indices])) == \
        expected
    # DataLoader's batched path gets the same data, a batch per index list.
    assert fingerprint(workloads.tiny_batches(100)[numpy.array(indices)]) \
        == expected


def test_tiny_batched_against_dataloaders_batched_path():
    pytest.importorskip('torch')
    from chainiter.bench import runner, workloads
    workload = workloads.get('tiny-batched', 8)
    next_batch, close = runner.make_loader('torch', workload, 0)
    try:
        x, labels = next_batch()
        assert tuple(x.shape) == (8, 16) and tuple(labels.shape) == (8,)
    finally:
        close()
