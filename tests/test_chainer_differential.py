"""chainiter against a real Chainer 7.8.1 (installed into a scratch venv by
the test run; see chainer_env.py): the same scenarios through Chainer's
SerialIterator and each chainiter kind, snapshots both ways under trainer
names, Chainer's dataset splits, and a whole Chainer Trainer run stopped and
resumed from its snapshot in a new process."""

import pytest

import chainer_env
from helpers import START_METHODS

# Chainer's MultiprocessIterator and chainiter's compared under fork and
# forkserver; under spawn (the longest: a fresh interpreter for every
# worker of both libraries, in each of the scenarios) with -m slow.  What
# spawn changes for chainiter (the dataset pickled to its workers) is
# checked against SerialIterator under every start method by
# test_resume.py and test_multiprocess.py; the batches and snapshots
# compared here come from the one pipeline whatever the start method.
KINDS = ['serial', 'thread'] + [
    'mp-' + m if m != 'spawn' else pytest.param(
        'mp-' + m, marks=pytest.mark.slow) for m in START_METHODS]

# How many records the script compares (so that the test cannot pass on an
# empty run): 12 scenarios, and snapshots after 7 + 4 + 6 steps, each in 6
# ways (saved and loaded by either library) for SerialIterator, 2 for the
# others; then shuffled snapshots after 3 step counts (2 for the
# multiprocess kinds, whose Chainer references start processes), each in 3
# ways, into Chainer's iterator of the same kind, and Chainer's unit test
# of old snapshots.
_RECORDS = {'serial': 12 + 17 * 6 + 3 * 3 + 1,
            'thread': 12 + 17 * 2 + 3 * 3 + 1}


@pytest.mark.timeout(900)     # the first run installs Chainer
@pytest.mark.parametrize('kind', KINDS)
def test_same_as_chainer(kind, tmp_path):
    records = chainer_env.run_script('differential.py', kind, tmp_path)
    assert len(records) >= _RECORDS.get(kind, 12 + 17 * 2 + 2 * 3 + 1)
    differ = {name: pair for name, pair in records.items()
              if pair[0] != pair[1]}
    assert not differ, '\n'.join(
        '{}:\n  chainer   {}\n  chainiter {}'.format(name, *pair)
        for name, pair in sorted(differ.items()))
    if kind == 'serial':
        assert any(name.startswith('datasets: ') for name in records)


@pytest.mark.timeout(900)
@pytest.mark.parametrize('kind', KINDS)
def test_chainer_trainer_resumes_bit_identically(kind, tmp_path):
    """Chainer's Trainer with StandardUpdater(iterator, optimizer) and
    Evaluator(test_iterator, model) in the plain form, LogReport and
    snapshot(): 12 iterations straight, against 6, a stop, and a resume
    from snapshot_iter_6 in a new process."""
    first = chainer_env.run_script('train.py', kind, tmp_path,
                                   'full-and-stop')
    resumed = chainer_env.run_script('train.py', kind, tmp_path,
                                     'resume')['resumed']
    full, stopped = first['full'], first['stopped']
    assert stopped['iteration'] == 6
    assert 'snapshot_iter_6' in stopped['snapshots']     # no suffix
    assert stopped['weights'] != full['weights']
    assert resumed['iteration'] == full['iteration'] == 12
    assert resumed['epoch_detail'] == full['epoch_detail'] == pytest.approx(
        12 * 6 / 40)
    assert resumed['weights'] == full['weights']
    for log in (full['log'], resumed['log']):
        log.pop('elapsed_time')
        assert 'validation/main/loss' in log    # the Evaluator ran
    assert resumed['log'] == full['log']
