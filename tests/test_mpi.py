"""Real ranks: ``mpiexec -n 2`` and ``-n 3`` run tests/mpi_scripts/
shard_run.py; the ranks' JSON outputs are checked against one process's
SerialIterator.  Skipped, with the reason, only where mpiexec or mpi4py is
missing (``pip install mpi4py mpich``: both are in the ``test`` extra)."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy
import pytest

import chainiter
from chainiter import distributed

SCRIPT = os.path.join(os.path.dirname(__file__), 'mpi_scripts',
                      'shard_run.py')
_RUN_TIMEOUT_S = 100


def find_mpiexec():
    """mpiexec next to this Python (pip's mpich puts it there), else on
    PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which('mpiexec')


MPIEXEC = find_mpiexec()
pytestmark = [
    pytest.mark.skipif(MPIEXEC is None, reason=(
        'no mpiexec next to {} nor on PATH: pip install mpich (or install '
        'Open MPI)'.format(sys.executable))),
    pytest.mark.skipif(importlib.util.find_spec('mpi4py') is None,
                       reason='mpi4py is not installed: pip install mpi4py'),
]


def mpirun(tmp_path, size, mode, *args):
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env['PYTHONPATH'] = os.pathsep.join(
        [root] + [p for p in [env.get('PYTHONPATH')] if p])
    for names in distributed.LAUNCHER_VARIABLES:   # the launcher sets its own
        for name in names:
            env.pop(name, None)
    result = subprocess.run(
        [MPIEXEC, '-n', str(size), sys.executable, SCRIPT, str(tmp_path),
         mode] + [str(a) for a in args],
        capture_output=True, text=True, timeout=_RUN_TIMEOUT_S, env=env,
        stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    outputs = []
    for rank in range(size):
        with open(tmp_path / '{}-rank{}.json'.format(mode, rank)) as f:
            outputs.append(json.load(f))
    assert [o['rank'] for o in outputs] == list(range(size))
    assert {o['size'] for o in outputs} == {size}
    return outputs


def _batches(output, key):
    return [step['batch'] for step in output[key]]


class KeyedDataset:
    def __len__(self):
        return 23

    def __getitem__(self, i):
        return [int(i), int(chainiter.example_rng().integers(2 ** 62))]


@pytest.mark.parametrize('size', [2, 3])
def test_ranks_share_one_global_order(tmp_path, size):
    outputs = mpirun(tmp_path, size, 'order')
    seed = outputs[0]['seed']
    assert {o['seed'] for o in outputs} == {seed}      # sent by rank 0
    # seed=1234 + rank: one allgather, and every rank raises alike.
    errors = {o.get('seed_error') for o in outputs}
    assert len(errors) == 1
    message = errors.pop()
    assert message and all('{} on rank {}'.format(1234 + r, r) in message
                           for r in range(size)), message
    # repeat=True: the same number of steps everywhere, each rank `batch`
    # rows, and together the serial iterator's global batches, keys too.
    counts = {len(o['repeat']) for o in outputs}
    assert len(counts) == 1
    reference = chainiter.SerialIterator(KeyedDataset(), 3 * size, seed=seed)
    for k in range(counts.pop()):
        expected = [list(row) for row in next(reference)]
        parts = [o['repeat'][k] for o in outputs]
        assert all(len(p['batch']) == 3 for p in parts)
        assert [row for p in parts for row in p['batch']] == expected
        assert {(p['epoch'], p['is_new_epoch'], p['epoch_detail'])
                for p in parts} == {(reference.epoch, reference.is_new_epoch,
                                     reference.epoch_detail)}
    # repeat=False: disjoint shares that cover the epoch, equal step counts,
    # the padding (fewer than `size` rows) only at the end.
    once = [o['once'] for o in outputs]
    assert len({len(steps) for steps in once}) == 1
    rows = [tuple(row) for k in range(len(once[0])) for steps in once
            for row in steps[k]['batch']]
    padding = sum(steps[-1]['padding'] for steps in once)
    assert padding < size
    epoch = rows[:len(rows) - padding]
    assert sorted(i for i, _ in epoch) == list(range(23))
    assert rows[len(rows) - padding:] == epoch[:padding]
    flat = chainiter.SerialIterator(KeyedDataset(), 23, repeat=False,
                                    seed=seed)
    assert [list(r) for r in epoch] == next(flat)
    # ChainerMN's API.
    bounds = distributed.share_bounds(23, size)
    order = numpy.random.RandomState(1).permutation(23)
    for o, (b, e) in zip(outputs, bounds):
        assert o['scatter_dataset'] == order[b:e].tolist()
        assert o['scatter_pieces'] == o['scatter_dataset']
    assert [tuple(o['scatter_index']) for o in outputs] == \
        distributed.share_bounds(23, size, False)
    assert {json.dumps(o['synchronized']) for o in outputs} == {
        json.dumps(outputs[0]['synchronized'])}
    assert outputs[0]['synchronized'][0] == 100


def test_saved_on_2_ranks_resumes_on_3(tmp_path):
    k = 3
    saved = mpirun(tmp_path, 2, 'save', k)
    assert saved[0]['state'] == saved[1]['state']   # the global position
    assert saved[0]['state']['global_batch_size'] == 6
    resumed = mpirun(tmp_path, 3, 'resume')
    assert {o['seed'] for o in resumed} == {11}
    assert len({len(o['steps']) for o in resumed}) == 1
    stream = [row for j in range(k) for o in saved
              for row in o['steps'][j]['batch']]
    stream += [row for j in range(len(resumed[0]['steps'])) for o in resumed
               for row in o['steps'][j]['batch']]
    reference = chainiter.SerialIterator(KeyedDataset(), 1, seed=11)
    expected = [list(next(reference)[0]) for _ in range(len(stream))]
    assert stream == expected      # nothing repeated, nothing skipped
    # 6 * k + 9 examples: epoch 1, position 4
    assert resumed[0]['steps'][0]['epoch_detail'] == 1 + (6 * k + 9 - 23) / 23
