"""chainiter against a real Chainer 7.8.1 (installed into a scratch venv by
the test run; see chainer_env.py): the same scenarios through Chainer's
SerialIterator and each chainiter kind, snapshots both ways under trainer
names, Chainer's dataset splits, and a whole Chainer Trainer run stopped and
resumed from its snapshot in a new process."""

import numpy
import pytest

import chainer_env
from helpers import START_METHODS

KINDS = ['serial', 'thread'] + ['mp-' + m for m in START_METHODS]

# How many records the script compares (so that the test cannot pass on an
# empty run): 12 scenarios, and snapshots after 7 + 4 + 6 steps, each in 6
# ways (saved and loaded by either library) for SerialIterator, 2 for the
# others.
_RECORDS = {'serial': 12 + 17 * 6}


@pytest.mark.timeout(900)     # the first run installs Chainer
@pytest.mark.parametrize('kind', KINDS)
def test_same_as_chainer(kind, tmp_path):
    records = chainer_env.run_script('differential.py', kind, tmp_path)
    assert len(records) >= _RECORDS.get(kind, 12 + 17 * 2)
    differ = {name: pair for name, pair in records.items()
              if pair[0] != pair[1]}
    assert not differ, '\n'.join(
        '{}:\n  chainer   {}\n  chainiter {}'.format(name, *pair)
        for name, pair in sorted(differ.items()))
    if kind == 'serial':
        assert any(name.startswith('datasets: ') for name in records)
