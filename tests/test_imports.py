import os
import re
import subprocess
import sys

import pytest

import chainiter


def test_import_needs_numpy_only():
    code = ('import sys, chainiter; '
            'print(sorted(m for m in ("cupy", "mpi4py", "torch", '
            '"cloudpickle", "keras", "lightning", "accelerate", "datasets") '
            'if m in sys.modules))')
    out = subprocess.run([sys.executable, '-c', code], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == '[]'


def test_keras_is_imported_by_chainiter_keras_alone():
    # chainiter.keras (KerasDataset) imports keras when it is imported
    # itself; no other module of chainiter names it.
    assert _modules_importing(r'keras\b') == ['keras.py']


def test_distributed_imports_no_mpi4py():
    # mpi4py is imported by chainiter.distributed.world() alone (module
    # _mpi); a sharded iterator and ChainerMN's API take the communicator
    # they are given.
    code = ('import sys, chainiter, chainiter.distributed; '
            'chainiter.SerialIterator([1, 2], 1, seed=0, shard=(1, 2)); '
            'print("mpi4py" in sys.modules)')
    out = subprocess.run([sys.executable, '-c', code], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == 'False'
    import chainiter.distributed._mpi as mpi
    with open(mpi.__file__) as f:
        assert 'mpi4py' in f.read()
    assert _modules_importing('mpi4py') == ['distributed/_mpi.py']


def test_numpy_and_cupy_devices_import_no_torch():
    # torch is imported by chainiter.backends.torch alone, and only when a
    # '@torch' device is used.
    code = (
        'import sys, numpy, chainiter\n'
        'from chainiter.backends._device import parse_device\n'
        'x = numpy.arange(6).reshape(3, 2)\n'
        'chainiter.to_device("@numpy", {"x": (x, [x])})\n'
        'chainiter.concat_examples([(x, 1), (x, 2)], device=-1)\n'
        'it = chainiter.DevicePrefetcher(chainiter.SerialIterator(\n'
        '    [x] * 4, 2), "@numpy")\n'
        'next(it)\n'
        'parse_device("@cupy:1"), parse_device("@torch:cuda:1")\n'
        'try:\n'
        '    chainiter.to_device("@cupy:0", x)\n'
        'except Exception:\n'
        '    pass\n'
        'print("torch" in sys.modules)\n')
    out = subprocess.run([sys.executable, '-c', code], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == 'False'
    # (chainiter.bench, run by hand, compares with torch's DataLoader.)
    root = os.path.dirname(chainiter.__file__)
    importers = []
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith('.py') and \
                    os.path.relpath(folder, root).split(os.sep)[0] != 'bench':
                with open(os.path.join(folder, name)) as f:
                    if re.search(r'^\s*(from|import) torch\b', f.read(),
                                 re.MULTILINE):
                        importers.append(os.path.relpath(
                            os.path.join(folder, name), root))
    assert importers == [os.path.join('backends', 'torch.py')]


def test_errors_hierarchy_and_exports():
    assert issubclass(chainiter.IteratorFinalizedError, RuntimeError)
    assert issubclass(chainiter.WorkerDiedError, RuntimeError)
    assert issubclass(chainiter.SnapshotMismatchError, ValueError)
    for cls in (chainiter.IteratorFinalizedError, chainiter.WorkerDiedError,
                chainiter.SnapshotMismatchError):
        assert issubclass(cls, chainiter.ChainiterError)
    assert issubclass(chainiter.TimeoutWarning, RuntimeWarning)
    assert issubclass(chainiter.WorkerRestartWarning, RuntimeWarning)
    assert issubclass(chainiter.SharedMemoryWarning, UserWarning)


def test_chainer_style_imports():
    from chainiter import dataset, datasets, iterators, serializers
    assert dataset.concat_examples is chainiter.concat_examples
    assert iterators.SerialIterator is chainiter.SerialIterator
    assert callable(serializers.save_npz) and callable(datasets.TupleDataset)


# A stand-in for Chainer's package layout: chainer.dataset.iterator.Iterator,
# a plain class whose __del__ calls finalize(), and the isinstance test
# Chainer's StandardUpdater makes.
_FAKE_CHAINER = {
    'chainer/__init__.py': 'from chainer import dataset\n',
    'chainer/dataset/__init__.py':
        'from chainer.dataset.iterator import Iterator\n',
    'chainer/dataset/iterator.py': (
        'class Iterator(object):\n'
        '    def __del__(self):\n'
        '        self.finalize()\n'
        '    def finalize(self):\n'
        '        pass\n'),
}

_CHECK = '''
import sys
{first}
import chainer.dataset, chainiter
it = chainiter.SerialIterator([1, 2, 3], 2, shuffle=False)
assert isinstance(it, chainer.dataset.Iterator)
assert isinstance(chainiter.DevicePrefetcher(it), chainer.dataset.Iterator)
assert not [f for f in sys.meta_path if 'chainiter' in type(f).__module__]
try:
    chainiter.MultithreadIterator([1], 1, n_threads=0)  # half-built
except ValueError:
    pass
print(next(it))
'''


def _run_with_fake_chainer(tmp_path, code):
    for name, text in _FAKE_CHAINER.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return subprocess.run(
        [sys.executable, '-W', 'error', '-X', 'dev', '-c', code],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize('first', ['import chainer', 'import chainiter'])
def test_chainer_takes_chainiter_iterators_whichever_is_imported_first(
        tmp_path, first):
    result = _run_with_fake_chainer(tmp_path, _CHECK.format(first=first))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '[1, 2]'
    assert 'Exception ignored' not in result.stderr


def test_import_chainiter_does_not_import_chainer(tmp_path):
    result = _run_with_fake_chainer(
        tmp_path, 'import sys, chainiter\n'
                  'print("chainer" in sys.modules)\n')
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'False'


def test_chainer_loaded_past_the_finder_is_adopted_when_an_iterator_is_built(
        tmp_path):
    # Another import hook put ahead of chainiter's finder loads Chainer.
    code = (
        'import importlib.machinery, sys\n'
        'import chainiter\n'
        'class Hook:\n'
        '    def find_spec(self, name, path, target=None):\n'
        '        if name.startswith("chainer"):\n'
        '            return importlib.machinery.PathFinder.find_spec(\n'
        '                name, path, target)\n'
        'sys.meta_path.insert(0, Hook())\n'
        'import chainer.dataset\n'
        'it = chainiter.SerialIterator([1, 2], 1)\n'
        'print(isinstance(it, chainer.dataset.Iterator))\n')
    result = _run_with_fake_chainer(tmp_path, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'True'


def _modules_importing(module):
    """The modules of chainiter (paths under the package) with an import
    statement of ``module`` (a regular expression)."""
    root = os.path.dirname(chainiter.__file__)
    importers = []
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith('.py'):
                with open(os.path.join(folder, name)) as f:
                    if re.search(r'^\s*(from|import) ' + module, f.read(),
                                 re.MULTILINE):
                        importers.append(os.path.relpath(
                            os.path.join(folder, name), root))
    return importers


# The rooms of the pipeline, in the order its imports run: each imports
# only the rooms before it ('' is the iterator's side, at the top).
_ROOMS = ['flow', 'memory', 'pool', '', 'processes', 'threads']


def _room_of(module):
    prefix = 'chainiter.iterators.pipeline'
    if not module.startswith(prefix):
        return None
    first = module[len(prefix):].lstrip('.').split('.')[0]
    return first if first in _ROOMS else ''


def test_the_pipelines_imports_run_one_way():
    import ast
    import pathlib
    root = pathlib.Path(chainiter.__file__).parent / 'iterators' / 'pipeline'
    wrong = []
    for path in sorted(root.rglob('*.py')):
        parts = path.relative_to(root.parent.parent.parent).with_suffix('')
        module = '.'.join(parts.parts)
        if path.name == '__init__.py':
            continue
        room = _room_of(module)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [
                    node.module + '.' + alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                other = _room_of(target)
                if other is None or other == room:
                    continue
                if target == 'chainiter.iterators.pipeline':
                    continue      # its modules are the targets that count
                if _ROOMS.index(other) > _ROOMS.index(room) or \
                        {room, other} == {'processes', 'threads'}:
                    wrong.append('{} imports {}'.format(module, target))
    assert wrong == []
