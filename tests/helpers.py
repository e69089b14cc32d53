"""Datasets and checks shared by the tests (module level, so picklable)."""

import io
import pickle

import numpy

import chainiter


class AugmentedDataset:
    """Example i is (i, base[i] + noise from example_rng())."""

    def __init__(self, n, width=3):
        self.base = numpy.arange(n * width, dtype=numpy.float32).reshape(
            n, width)

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        noise = chainiter.example_rng().normal(size=self.base.shape[1])
        return i, (self.base[i] + noise).astype(numpy.float32)


def fingerprint(batch):
    """Bytes that are equal exactly when two batches are equal value for
    value, dtype for dtype and shape for shape."""
    return pickle.dumps(batch, protocol=4)


def take(iterator, n):
    return [fingerprint(next(iterator)) for _ in range(n)]


def snapshot(iterator, via):
    """The iterator's snapshot, through an npz file or a state dict."""
    if via == 'npz':
        f = io.BytesIO()
        chainiter.serializers.save_npz(f, iterator)
        return f.getvalue()
    return iterator.state_dict()


def restore(iterator, data, via):
    if via == 'npz':
        chainiter.serializers.load_npz(io.BytesIO(data), iterator)
    else:
        iterator.load_state_dict(data)
    return iterator


def assert_resume_equivalent(make_source, make_targets, n_steps):
    """Snapshot ``make_source()`` before every step of an ``n_steps`` run,
    restore each snapshot into a fresh iterator from every factory in
    ``make_targets``, and check that the rest of the stream is byte for
    byte the uninterrupted one.  Snapshots alternate between npz files and
    state dicts."""
    with make_source() as reference:
        expected = take(reference, n_steps)
    with make_source() as source:
        for k in range(n_steps):
            via = 'npz' if k % 2 == 0 else 'dict'
            data = snapshot(source, via)
            for make_target in make_targets:
                with make_target() as target:
                    restore(target, data, via)
                    got = take(target, n_steps - k)
                    assert got == expected[k:], (
                        'resumed after step {} into {} ({}): the stream '
                        'differs'.format(k, type(target).__name__, via))
            assert fingerprint(next(source)) == expected[k]
