import subprocess
import sys

import chainiter


def test_import_needs_numpy_only():
    code = ('import sys, chainiter; '
            'print(sorted(m for m in ("cupy", "mpi4py", "torch") '
            'if m in sys.modules))')
    out = subprocess.run([sys.executable, '-c', code], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == '[]'


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
