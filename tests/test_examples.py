"""The examples run, under every start method, and resume exactly."""

import os
import subprocess
import sys

import pytest

from helpers import start_methods_kept

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(name, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'examples', name)] + list(args),
        env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_train_digits(method):
    pytest.importorskip('sklearn')
    out = _run('train_digits.py', '--epochs', '2', '--start-method', method)
    assert 'MultiprocessIterator, 2 workers ({})'.format(method) in out
    assert 'resumed at epoch' in out
    assert "iterator stats (resumed run): {'batches': " in out
    assert 'bit-identical to the uninterrupted run: True' in out


# Under spawn -m slow: chainiter's workers take the path of forkserver's
# there (the dataset pickled to a fresh interpreter that imports torch with
# it), only slower to start; test_resume.py resumes under all three.
@pytest.mark.parametrize('method', start_methods_kept('fork', 'forkserver'))
def test_train_torch(method):
    pytest.importorskip('torch')
    out = _run('train_torch.py', '--epochs', '2', '--start-method', method)
    assert 'bit-identical to the uninterrupted run: True' in out
