"""The benchmark runs (smoke mode); its figures are not checked here."""

import os
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
    assert workloads == {'images', 'tiny', 'tiny-batched', 'tiny-copy',
                         'cpu', 'variable', 'variable-labelled',
                         'variable-packed', 'bucketed'}
    loaders = {row.split('|')[3].strip() for row in rows}
    assert loaders == {'chainiter', 'chainiter-list', 'serial'}
    # Every loader row gives the main process's CPU per batch.
    header = [cell.strip() for cell in out.stdout.splitlines()[0].split(
        '|')[1:-1]]
    column = header.index('main CPU us/batch')
    for row in rows:
        assert float(row.split('|')[1:-1][column]) > 0, row


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


def run(rate):
    """One measurement of ``rate`` examples/s, as the runner records it."""
    return [{'examples_per_s': rate, 'first_batch_s': 0.1,
             'peak_pss_bytes': 2 ** 20}]


def test_table_compares_like_with_like():
    from chainiter.bench.__main__ import format_table
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
        found = set(runner.descendants(os.getpid()))
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
    (['--workloads', ''], ['nothing to run', '--dataset']),
    (['--compare', 'nosuch'], ['nosuch', 'torch, grain', 'torch,grain']),
    (['--compare', 'grain,torch:8'], ["'torch:8'", 'torch, grain']),
    (['--loaders', 'grain:0'], ['grain:0', 'NAME:K']),
    (['--loaders', 'chainiter:n_prefetch=x'],
     ["n_prefetch='x'", 'n_prefetch=4+shared_mem=8000']),
    (['--loaders', 'torch:shared_mem=4096'],
     ['torch:shared_mem=4096', 'NAME:K'])])
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


@pytest.mark.parametrize('peer, release', [('torch', 'torch==2.13.0'),
                                           ('grain', 'grain==0.2.18')])
def test_bench_says_which_peer_is_missing(tmp_path, peer, release):
    # A package of that name that fails to import stands in for a machine
    # without it.
    (tmp_path / peer).mkdir()
    (tmp_path / peer / '__init__.py').write_text(
        'raise ImportError({!r})\n'.format('No module named ' + repr(peer)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path)] + sys.path))
    out = subprocess.run(
        [sys.executable, '-m', 'chainiter.bench', '--smoke', '--compare',
         peer],
        capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ''
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and 'memcpy' not in out.stderr, out.stderr
    assert 'the {} loaders need {}'.format(peer, peer) in lines[0]
    assert 'pip install ' + release in lines[0]


def test_compare_takes_a_list_or_repeats():
    from chainiter.bench.__main__ import _peers
    assert _peers([]) == []
    assert _peers(['torch,grain']) == ['torch', 'grain']
    assert _peers(['grain', 'torch', 'grain']) == ['grain', 'torch']
    with pytest.raises(ValueError, match="'jax'.*torch, grain"):
        _peers(['torch,jax'])


def test_table_compares_with_each_peer_that_ran():
    from chainiter.bench.__main__ import format_table
    results = {('tiny', 2, 'chainiter'): run(800.0),
               ('tiny', 2, 'chainiter:16'): run(1200.0),
               ('tiny', 2, 'torch'): run(100.0),
               ('tiny', 2, 'grain'): run(50.0),
               ('tiny', 2, 'grain:16'): run(400.0),
               ('tiny', 2, 'serial'): run(400.0),
               # grain skipped bucketed: no row, '-' against it
               ('bucketed', 2, 'chainiter'): run(300.0),
               ('bucketed', 2, 'torch'): run(100.0)}
    loaders = ['chainiter', 'chainiter:16', 'serial', 'torch', 'grain',
               'grain:16']
    table = format_table(results, ['tiny', 'bucketed'], [2], loaders, 1e9)
    lines = [[cell.strip() for cell in line.split('|')[1:-1]]
             for line in table.splitlines()]
    header = lines[0]
    assert header[4:7] == ['vs torch', 'vs grain', 'vs serial']
    rows = {(row[0], row[2]): dict(zip(header, row)) for row in lines[2:]}
    assert rows['tiny', 'chainiter']['vs grain'] == '16.00x'
    assert rows['tiny', 'chainiter:16']['vs grain'] == '3.00x'  # grain:16
    assert rows['tiny', 'chainiter:16']['vs torch'] == '12.00x'  # no torch:16
    assert rows['tiny', 'grain']['vs torch'] == '0.50x'
    assert rows['bucketed', 'chainiter']['vs grain'] == '-'
    assert ('bucketed', 'grain') not in rows
    # Without grain the table keeps its columns.
    table = format_table(results, ['tiny'], [2], ['chainiter', 'torch'], 1e9)
    assert 'vs grain' not in table and 'vs torch' in table


def test_grain_skips_workloads_with_their_own_batch_order():
    from chainiter.bench import runner, workloads
    reason = runner.unsupported('grain', workloads.get('bucketed'))
    assert 'batch sampler' in reason
    for name in workloads.WORKLOADS:
        if name != 'bucketed':
            assert runner.unsupported('grain', workloads.get(name)) is None
        assert runner.unsupported('chainiter', workloads.get(name)) is None
        assert runner.unsupported('torch:4', workloads.get(name)) is None


@pytest.mark.parametrize('name, shapes', [
    ('tiny', [(8, 16), (8,)]),
    ('tiny-batched', [(8, 16), (8,)])])
def test_grain_dataloader_batches_as_chainiter(name, shapes):
    pytest.importorskip('grain')
    from chainiter.bench import runner, workloads
    next_batch, close = runner.make_loader('grain', workloads.get(name, 8),
                                           0)
    try:
        batch = next_batch()
        assert [tuple(x.shape) for x in batch] == shapes
    finally:
        close()


def test_grain_pads_variable_with_the_workloads_converter():
    pytest.importorskip('grain')
    from chainiter.bench import runner, workloads
    next_batch, close = runner.make_loader(
        'grain:2', workloads.get('variable', 4), 0)
    try:
        batch = next_batch()
        assert batch.shape[0] == 4 and batch.dtype == 'int32'
        assert (batch[:, 0] == 0).all()      # each row an arange, padded
    finally:
        close()


@pytest.mark.timeout(120)
def test_bench_compare_grain_skips_what_grain_cannot_run():
    pytest.importorskip('grain')
    out = run_bench('--smoke', '--workloads', 'tiny,bucketed', '--workers',
                    '1', '--loaders', 'serial', '--compare', 'grain',
                    timeout=110)
    assert out.returncode == 0, out.stderr
    rows = [line.split('|') for line in out.stdout.splitlines()
            if line.startswith('| ') and not line.startswith('| workload |')]
    assert sorted((row[1].strip(), row[3].strip()) for row in rows) == [
        ('bucketed', 'serial'), ('tiny', 'grain'), ('tiny', 'serial')]
    assert 'skipping grain on bucketed' in out.stderr
    assert 'grain did not run bucketed' in out.stdout


@pytest.mark.parametrize('name, parsed', [
    ('chainiter', ('chainiter', None, {})),
    ('chainiter:8', ('chainiter', 8, {})),
    ('torch:8', ('torch', 8, {})),
    ('serial', ('serial', None, {})),
    ('chainiter:n_prefetch=4', ('chainiter', None, {'n_prefetch': 4})),
    ('chainiter:shared_mem=4096', ('chainiter', None, {'shared_mem': 4096})),
    ('chainiter:maxtasksperchild=1000',
     ('chainiter', None, {'maxtasksperchild': 1000})),
    ('chainiter-list:n_prefetch=4',
     ('chainiter-list', None, {'n_prefetch': 4})),
    ('chainiter:n_prefetch=4+shared_mem=8000',
     ('chainiter', None, {'n_prefetch': 4, 'shared_mem': 8000})),
    ('chainiter:8+shared_mem=None',
     ('chainiter', 8, {'shared_mem': None})),
    ('chainiter-list:prefetch_bytes=1048576+maxtasksperchild=10',
     ('chainiter-list', None, {'prefetch_bytes': 2 ** 20,
                               'maxtasksperchild': 10})),
    ('threads', ('threads', None, {})),
    ('threads-list:2', ('threads-list', 2, {})),
    ('threads:n_prefetch=None', ('threads', None, {'n_prefetch': None}))])
def test_loader_names_carry_iterator_arguments(name, parsed):
    from chainiter.bench import runner
    assert runner.parse_loader(name) == parsed


@pytest.mark.parametrize('name, words', [
    ('chainiter:nosuch=1', ["'nosuch'", 'n_prefetch, shared_mem',
                            'chainiter:n_prefetch=4+shared_mem=8000']),
    ('chainiter:n_prefetch=x', ["n_prefetch='x'", 'positive integer',
                                'None']),
    ('chainiter:shared_mem=0', ["shared_mem='0'", 'positive integer']),
    ('chainiter:shared_mem=-5', ["shared_mem='-5'", 'positive integer']),
    ('chainiter:prefetch_bytes=None', ["prefetch_bytes='None'",
                                       'positive integer']),
    ('chainiter-list:n_prefetch=4+n_prefetch=8', ["'n_prefetch'",
                                                  'twice']),
    ('chainiter:8+n_prefetch=4', ['chainiter:8+n_prefetch=4',
                                  'n_prefetch = K x workers']),
    ('chainiter:8+4', ['chainiter:8+4', 'NAME:K']),
    ('chainiter:n_prefetch=4;shared_mem=8000',
     ["n_prefetch='4;shared_mem=8000'", "separated by '+'"]),
    ('chainiter:', ["'chainiter:'", 'NAME:K']),
    ('chainiter:n_prefetch=4+', ["'chainiter:n_prefetch=4+'", 'NAME:K']),
    ('torch:n_prefetch=4', ['torch:n_prefetch=4', 'NAME:K']),
    ('serial:shared_mem=4096', ['serial:shared_mem=4096', 'NAME:K']),
    ('threads:shared_mem=4096', ["no 'shared_mem'", 'n_prefetch']),
    ('threads-list:maxtasksperchild=9', ["no 'maxtasksperchild'"])])
def test_bad_loader_arguments_say_the_right_form(name, words):
    from chainiter.bench import runner
    with pytest.raises(ValueError) as e:
        runner.parse_loader(name)
    for word in words:
        assert word in str(e.value), str(e.value)


def iterator_of(next_batch):
    """The MultiprocessIterator behind a chainiter loader of the bench."""
    return getattr(next_batch, 'iterator', None) or next_batch.__self__


@pytest.mark.parametrize('name, attributes', [
    ('chainiter:n_prefetch=3+shared_mem=65536',
     {'n_prefetch': 3, 'shared_mem': 65536, 'maxtasksperchild': None}),
    ('chainiter-list:maxtasksperchild=1000+n_prefetch=2',
     {'n_prefetch': 2, 'maxtasksperchild': 1000, 'shared_mem': None}),
    ('chainiter-list:2', {'n_prefetch': 2})])
def test_loader_arguments_reach_the_iterator(method, name, attributes):
    from chainiter.bench import runner, workloads
    workload = workloads.get('tiny-copy', 4)
    next_batch, close = runner.make_loader(name, workload, 1,
                                           start_method=method)
    try:
        x, labels = next_batch()
        assert x.shape == (4, 16) and labels.shape == (4,)
        it = iterator_of(next_batch)
        assert it.start_method == method
        for key, value in attributes.items():
            assert getattr(it, key) == value, key
        # n_prefetch is a floor, below the depth of these small batches
        # (16 per worker) here.
        assert it.stats['prefetch'] == max(
            attributes['n_prefetch'], it.MAX_PREFETCH_PER_WORKER)
    finally:
        close()


def test_table_names_each_variant_and_the_spread_of_its_repeats():
    from chainiter.bench.__main__ import format_table
    results = {('tiny', 2, 'chainiter'): [run(900.0)[0], run(1000.0)[0],
                                          run(1100.0)[0]],
               ('tiny', 2, 'chainiter:n_prefetch=4+shared_mem=4096'):
               run(500.0),
               ('tiny', 2, 'chainiter:8'): run(700.0),
               ('tiny', 2, 'torch'): run(100.0),
               ('tiny', 2, 'torch:8'): run(350.0),
               ('tiny', 2, 'serial'): run(400.0)}
    loaders = ['chainiter', 'chainiter:n_prefetch=4+shared_mem=4096',
               'chainiter:8', 'serial', 'torch', 'torch:8']
    table = format_table(results, ['tiny'], [2], loaders, 1e9)
    lines = [[cell.strip() for cell in line.split('|')[1:-1]]
             for line in table.splitlines()]
    header = lines[0]
    rows = {row[2]: dict(zip(header, row)) for row in lines[2:]}
    assert set(rows) == set(loaders)
    assert rows['chainiter']['spread'] == '20%'      # (1100 - 900) / 1000
    assert rows['serial']['spread'] == '-'           # one repeat
    # A variant is compared with the peers at their defaults; :K with :K.
    assert rows['chainiter:n_prefetch=4+shared_mem=4096']['vs torch'] == \
        '5.00x'
    assert rows['chainiter:8']['vs torch'] == '2.00x'


def test_repeats_that_disagree_are_named_in_a_warning():
    from chainiter.bench.__main__ import spread, spread_warning
    assert spread([100.0]) == 0.0
    assert spread([90.0, 100.0, 110.0]) == pytest.approx(0.2)
    assert spread([80.0, 146.0]) == pytest.approx(66 / 113)

    def rates(*values):
        return [{'examples_per_s': v} for v in values]
    quiet = {('tiny', 2, 'chainiter'): rates(100.0, 105.0, 110.0),
             ('tiny', 2, 'serial'): rates(50.0, 50.0, 59.0)}
    assert spread_warning(quiet) is None
    busy = dict(quiet)
    busy['tiny', 2, 'chainiter:n_prefetch=4'] = rates(80.0, 146.0, 120.0)
    busy['images', 4, 'serial'] = rates(10.0, 13.0, 10.0)
    busy['images', 4, 'chainiter'] = rates(10.0)       # one repeat
    message = spread_warning(busy)
    assert message.startswith('warning: ')
    assert 'tiny, 2 workers, chainiter:n_prefetch=4 (55%)' in message
    assert 'images, 0 workers, serial (30%)' in message
    assert 'chainiter (' not in message and '(18%)' not in message
    assert 'more than 20%' in message and 'busy' in message
    assert '--repeats' in message and 'quiet machine' in message


def test_tiny_copy_and_variable_labelled_examples_are_what_users_write():
    import pickle

    import numpy

    from chainiter.bench import workloads
    tiny = workloads.TinyCopy(100)
    x, label = tiny[numpy.int64(13)]
    assert x.dtype == numpy.float32 and x.shape == (16,)
    assert type(label) is int and label == 3
    assert not numpy.shares_memory(x, tiny.data)     # a fresh copy
    assert (x == workloads.Tiny(100)[13][0]).all()
    variable = workloads.VariableLabelled(100)
    lengths = set()
    for i in range(len(variable)):
        x, label = variable[numpy.int64(i)]
        assert x.dtype == numpy.int32 and x.ndim == 1
        assert 10 <= len(x) <= 2000 and type(label) is int
        assert not numpy.shares_memory(x, variable.data)
        assert (x == variable.data[:len(x)]).all()
        lengths.add(len(x))
    assert len(lengths) > 50
    for dataset in (tiny, variable):        # as spawn sends them
        copy = pickle.loads(pickle.dumps(dataset))
        assert len(copy) == 100
    workload = workloads.get('variable-labelled')
    assert workload.batch_size == 64
    batch = [variable[i] for i in (3, 7, 11)]
    x, labels = workload.converter(batch)
    assert x.dtype == numpy.int32 and labels.shape == (3,)
    assert x.shape == (3, max(len(e[0]) for e in batch))
    assert (x[0, len(batch[0][0]):] == 0).all()          # padded with 0
    assert workloads.get('tiny-copy').batch_size == 256


def test_variable_labelled_against_dataloader():
    pytest.importorskip('torch')
    from chainiter.bench import runner, workloads
    next_batch, close = runner.make_loader(
        'torch', workloads.get('variable-labelled', 4), 0)
    try:
        x, labels = next_batch()
        assert x.shape[0] == 4 and str(x.dtype) == 'torch.int32'
        assert tuple(labels.shape) == (4,)
        assert (x[:, 0] == 1).all()       # each row a prefix of 1..2000
        assert (x[:, -1] == 0).any()      # padded with 0
    finally:
        close()


@pytest.mark.parametrize('name', ['threads', 'threads-list'])
def test_thread_loaders_run_multithread_iterators(name):
    from chainiter import MultithreadIterator
    from chainiter.bench import runner, workloads
    workload = workloads.get('tiny-copy', 4)
    next_batch, close = runner.make_loader(name, workload, 2)
    try:
        x, labels = next_batch()
        assert x.shape == (4, 16) and labels.shape == (4,)
        it = iterator_of(next_batch)
        assert type(it) is MultithreadIterator and it.n_threads == 2
    finally:
        close()

def test_variable_packed_is_the_issues_variable_workload():
    import pickle

    import numpy

    from chainiter.bench import workloads
    packed = workloads.VariablePacked()
    assert len(packed) == 4096
    assert packed.data.dtype == numpy.int32 and packed.data.ndim == 1
    lengths = numpy.diff(packed.offsets)
    assert lengths.min() >= 10 and lengths.max() <= 2000
    assert len(set(lengths.tolist())) > 1000
    for i in (0, 1, 2047, 4095):
        x, label = packed[numpy.int64(i)]
        assert x.dtype == numpy.int32 and len(x) == lengths[i]
        assert type(label) is int and label == i % 10
        assert not numpy.shares_memory(x, packed.data)    # a copy
        assert (x == packed.data[packed.offsets[i]:][:len(x)]).all()
        assert (x != 0).all()      # 0 is the padding
    small = workloads.VariablePacked(50)
    assert len(pickle.loads(pickle.dumps(small))) == 50
    workload = workloads.get('variable-packed')
    assert workload.batch_size == 64
    batch = [packed[i] for i in (3, 7, 11)]
    x, labels = workload.converter(batch)
    assert x.shape == (3, max(len(e[0]) for e in batch))
    assert labels.tolist() == [3, 7, 1]
    for row, (example, _) in zip(x, batch):
        assert (row[:len(example)] == example).all()
        assert (row[len(example):] == 0).all()


@pytest.mark.parametrize('loader', ['chainiter', 'chainiter-list',
                                    'serial', 'threads'])
def test_a_run_records_the_main_processes_cpu_per_batch(loader):
    from chainiter.bench import runner
    record = runner.measure(loader, 'tiny-copy', 0 if loader == 'serial'
                            else 1, 0.2, 0.0, 16)
    main = record['main_cpu_us_per_batch']
    thread = record['main_thread_cpu_us_per_batch']
    others = record['other_threads_cpu_us_per_batch']
    assert main == pytest.approx(thread + others)
    assert thread > 0 and main > 0
    if loader == 'serial':
        # No thread but the main one and the memory sampler, which is
        # not counted: the others' share is the clocks' rounding.
        assert abs(others) < 0.05 * thread + 5, record
    elif loader == 'threads':
        # The worker threads' CPU is theirs, counted apart: what is left
        # of the others is the clocks' rounding.
        assert record['worker_threads_cpu_us_per_batch'] > thread, record
        assert abs(others) < 0.05 * main + 5, record
    else:
        assert others > 0, record     # the receiver thread's
        assert record['worker_threads_cpu_us_per_batch'] == 0, record


def test_main_cpu_counts_the_loaders_threads_not_the_samplers():
    import threading

    from chainiter.bench import runner

    def spin(stop):
        while not stop.is_set():
            sum(range(1000))
    stop_sampler, stop_loader = threading.Event(), threading.Event()
    sampler = threading.Thread(target=spin, args=(stop_sampler,))
    loader = threading.Thread(target=spin, args=(stop_loader,))
    sampler.start()
    loader.start()
    try:
        cpu = runner.MainCpu(sampler)
        cpu.start()
        loader_start = runner.thread_cpu_s(loader)
        threading.Event().wait(0.3)      # the threads spin meanwhile
        loader_cpu = runner.thread_cpu_s(loader) - loader_start
        in_next, others, workers = cpu.stop()
    finally:
        stop_sampler.set()
        stop_loader.set()
        sampler.join()
        loader.join()
    assert in_next == 0.0 and workers == 0.0    # no worker thread here
    assert loader_cpu > 0.01
    # The loader's thread, and nothing of the sampler's (both spun about
    # as much): what the main thread did between the reads aside.
    assert others == pytest.approx(loader_cpu, rel=0.2, abs=0.01)


def test_the_table_and_json_give_the_main_processes_cpu_per_batch(
        tmp_path):
    import json

    from chainiter.bench.__main__ import format_table, json_rows

    def cpu_run(rate, us):
        return dict(run(rate)[0], main_cpu_us_per_batch=us,
                    main_thread_cpu_us_per_batch=us - 1.0,
                    other_threads_cpu_us_per_batch=1.0)
    results = {('tiny', 2, 'chainiter'): [cpu_run(900.0, 20.0),
                                          cpu_run(1000.0, 30.0),
                                          cpu_run(1100.0, 25.0)],
               ('tiny', 2, 'torch'): [cpu_run(100.0, 60.5)],
               ('tiny', 2, 'serial'): run(400.0)}      # none recorded
    loaders = ['chainiter', 'serial', 'torch']
    table = format_table(results, ['tiny'], [2], loaders, 1e9)
    lines = [[cell.strip() for cell in line.split('|')[1:-1]]
             for line in table.splitlines()]
    rows = {row[2]: dict(zip(lines[0], row)) for row in lines[2:]}
    assert rows['chainiter']['main CPU us/batch'] == '25.0'     # median
    assert rows['torch']['main CPU us/batch'] == '60.5'
    assert rows['serial']['main CPU us/batch'] == '-'
    rows = {row['loader']: row for row in json.loads(json.dumps(
        json_rows(results)))}
    assert rows['chainiter']['main_cpu_us_per_batch'] == 25.0
    assert rows['chainiter']['main_thread_cpu_us_per_batch'] == 24.0
    assert rows['chainiter']['examples_per_s'] == 1000.0
    assert rows['chainiter']['spread'] == pytest.approx(0.2)
    assert len(rows['chainiter']['runs']) == 3
    assert rows['serial']['main_cpu_us_per_batch'] is None


def test_bench_json_writes_every_row(tmp_path):
    import json
    path = tmp_path / 'rows.json'
    out = run_bench('--smoke', '--workloads', 'tiny-copy', '--loaders',
                    'chainiter,serial', '--json', str(path), timeout=120)
    assert out.returncode == 0, out.stderr
    rows = json.loads(path.read_text())
    assert {row['loader'] for row in rows} == {'chainiter', 'serial'}
    for row in rows:
        assert row['workload'] == 'tiny-copy'
        assert row['main_cpu_us_per_batch'] > 0
        assert len(row['runs']) == 1
