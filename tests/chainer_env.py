"""A real Chainer 7.8.1 for the differential tests, in a scratch virtual
environment next to the test run (never a dependency of chainiter).

It is made once per Python version under ``$CHAINITER_CHAINER_VENV`` (by
default ``~/.cache/chainiter-tests``) and reused.  Scripts run there with
the repository on ``PYTHONPATH``, so they import this checkout's chainiter
next to Chainer.  Where Chainer cannot be installed (no network, or no numpy
< 2 for this Python), the tests that need it are skipped with pip's reason.
"""

import fcntl
import json
import os
import pathlib
import subprocess
import sys
import venv

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = pathlib.Path(__file__).resolve().parent / 'chainer_scripts'
_PACKAGES = ['chainer==7.8.1', 'numpy<2']
_INSTALL_TIMEOUT_S = 600
_failed = []    # why the install failed, once per test run


def _root():
    return pathlib.Path(os.environ.get(
        'CHAINITER_CHAINER_VENV',
        pathlib.Path.home() / '.cache' / 'chainiter-tests'))


def _pip(python, *args):
    return subprocess.run(
        [str(python), '-m', 'pip', '--disable-pip-version-check', '-q']
        + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, timeout=_INSTALL_TIMEOUT_S,
        universal_newlines=True)


def chainer_python():
    """The interpreter of a venv with Chainer 7.8.1; skips the test when
    none can be made."""
    # 3.13t (free-threaded) apart from 3.13: another ABI.
    tag = 'chainer-7.8.1-py{}.{}{}'.format(*sys.version_info[:2],
                                           getattr(sys, 'abiflags', ''))
    root = _root()
    root.mkdir(parents=True, exist_ok=True)
    home = root / tag
    python = home / 'bin' / 'python'
    ready = home / 'READY'
    with open(str(root / (tag + '.lock')), 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():
            return python
        if _failed:
            pytest.skip(_failed[0])
        venv.EnvBuilder(with_pip=True, clear=True).create(str(home))
        steps = [['install', 'setuptools<70', 'wheel'],
                 # numpy < 2 only as a wheel: no build from source.
                 ['install', '--only-binary=numpy', 'numpy<2'],
                 ['install', '--no-build-isolation'] + _PACKAGES]
        for step in steps:
            result = _pip(python, *step)
            if result.returncode != 0:
                reason = ('Chainer 7.8.1 could not be installed into a '
                          'scratch venv for Python {}.{}{} (pip {}): {}'.format(
                              sys.version_info[0], sys.version_info[1],
                              getattr(sys, 'abiflags', ''),
                              ' '.join(step),
                              result.stdout.strip()[-600:]))
                _failed.append(reason)
                pytest.skip(reason)
        ready.write_text('')
        return python


def run_script(name, *args, timeout=240):
    """Run ``chainer_scripts/name`` under Chainer's venv; return its last
    line of output parsed as JSON."""
    python = chainer_python()
    env = dict(os.environ, PYTHONPATH=str(REPO),
               PYTHONWARNINGS='ignore::DeprecationWarning')
    result = subprocess.run(
        [str(python), str(SCRIPTS / name)] + [str(a) for a in args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        stdin=subprocess.DEVNULL, timeout=timeout, universal_newlines=True)
    assert result.returncode == 0, '{} {} failed:\n{}\n{}'.format(
        name, args, result.stdout[-3000:], result.stderr[-5000:])
    return json.loads(result.stdout.strip().splitlines()[-1])
