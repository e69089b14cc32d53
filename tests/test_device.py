"""Device transfer: the host paths everywhere, the GPU paths where cupy and a
GPU are present (marked ``gpu``; run with ``python -m pytest -m gpu``)."""


import subprocess
import sys
import textwrap

import numpy
import pytest

import chainiter
from chainiter import (
    ConcatWithAsyncTransfer,
    DevicePrefetcher,
    MultiprocessIterator,
    MultithreadIterator,
    SerialIterator,
    concat_examples,
)
from chainiter.backends import cuda

from fake_cupy import FakeCupy
from helpers import (
    AugmentedDataset,
    Examples,
    assert_resume_equivalent,
    fingerprint,
)

N, BATCH = 11, 4


def same(a, b):
    return fingerprint(a) == fingerprint(b)


@pytest.mark.parametrize('depth', [0, 1, 3])
@pytest.mark.parametrize('device', [None, -1, '@numpy'])
def test_prefetcher_on_the_host_gives_the_batches_and_attributes(depth,
                                                                 device):
    dataset = AugmentedDataset(N)
    with DevicePrefetcher(SerialIterator(dataset, BATCH, seed=1), device,
                          depth=depth) as it, \
            SerialIterator(dataset, BATCH, seed=1) as ref:
        for _ in range(10):
            assert same(next(it), concat_examples(next(ref)))
            for name in ('epoch', 'current_position', 'is_new_epoch',
                         'epoch_detail', 'previous_epoch_detail'):
                assert getattr(it, name) == getattr(ref, name), name
            assert it.batch_size == BATCH


def test_prefetcher_no_repeat_ends():
    with DevicePrefetcher(SerialIterator(list(range(5)), 2, repeat=False,
                                         shuffle=False), depth=2) as it:
        batches = [b.tolist() for b in it]
    assert batches == [[0, 1], [2, 3], [4]]


def test_prefetcher_reset():
    with DevicePrefetcher(SerialIterator(list(range(7)), 2, seed=0)) as it:
        [next(it) for _ in range(3)]
        it.reset()
        assert it.epoch == 0 and it.current_position == 0
        got = [next(it).tolist() for _ in range(3)]
    with SerialIterator(list(range(7)), 2, seed=0) as plain:
        plain.reset()       # the same new pass as the wrapped iterator's
        assert got == [next(plain) for _ in range(3)]


@pytest.mark.parametrize('depth', [1, 3])
def test_prefetcher_snapshot_does_not_count_batches_fetched_ahead(depth):
    dataset = AugmentedDataset(N)
    kinds = [
        lambda: DevicePrefetcher(SerialIterator(dataset, BATCH, seed=5),
                                 depth=depth),
        lambda: DevicePrefetcher(
            MultithreadIterator(dataset, BATCH, n_threads=2, seed=6),
            depth=1),
        lambda: DevicePrefetcher(SerialIterator(dataset, BATCH, seed=6),
                                 depth=0),
    ]
    assert_resume_equivalent(kinds[0], kinds, 9)


def test_prefetcher_snapshot_loads_into_a_plain_iterator():
    dataset = list(range(10))
    with DevicePrefetcher(SerialIterator(dataset, 3, seed=2), depth=3) as it:
        next(it)
        state = it.state_dict()
        expected = [next(it).tolist() for _ in range(3)]
    with SerialIterator(dataset, 3) as plain:
        plain.load_state_dict(state)
        assert [list(map(int, next(plain))) for _ in range(3)] == expected


def test_batches_waiting_for_transfer_keep_their_shared_memory(method):
    """Batches fetched ahead (whose copy to the device would be in flight)
    view MultiprocessIterator's shared memory: the workers must not refill
    it until they are handed out and dropped."""
    dataset = Examples(40, 'tuple')
    with DevicePrefetcher(MultiprocessIterator(
            dataset, 4, n_processes=2, seed=3, converter=concat_examples,
            start_method=method), depth=5) as it, \
            SerialIterator(dataset, 4, seed=3) as ref:
        for _ in range(25):
            assert same(next(it), concat_examples(next(ref)))


def test_async_converter_on_the_host_is_concat_examples():
    converter = ConcatWithAsyncTransfer()
    batch = [(numpy.arange(i + 1), i) for i in range(3)]
    for device in (None, -1, '@numpy'):
        assert same(converter(batch, device, padding=0),
                    concat_examples(batch, padding=0))


def test_gpu_device_without_cupy_says_how_to_fix():
    if cuda.is_available():
        pytest.skip('a GPU is present')
    with pytest.raises(RuntimeError,
                       match=r'chainiter\[cuda\]|no usable CUDA GPU'):
        ConcatWithAsyncTransfer()([numpy.arange(3)], 0)
    with pytest.raises(RuntimeError,
                       match=r'chainiter\[cuda\]|no usable CUDA GPU'):
        DevicePrefetcher(SerialIterator([1, 2], 1), device='@cupy:0')


def test_shared_region_finds_the_buffer_of_a_stacked_batch(method):
    from chainiter.dataset.async_transfer import shared_region
    with MultiprocessIterator(Examples(12, 'tuple'), 4, n_processes=1,
                              converter=concat_examples,
                              start_method=method) as it:
        next(it)                          # measures the sizes
        x, _, _ = next(it)
        address, nbytes = shared_region(x)
        assert nbytes >= x.nbytes and address > 0
    assert shared_region(numpy.zeros(3)) is None


def test_bad_depth():
    with pytest.raises(ValueError, match='depth'):
        DevicePrefetcher(SerialIterator([1], 1), depth=-1)


# ---- with a stand-in for cupy (tests/fake_cupy.py) ------------------------


@pytest.fixture
def fake(monkeypatch):
    """A GPU whose copies from page-locked memory run only when their
    stream is synchronised (so reusing their source too early shows)."""
    gpu = FakeCupy()
    monkeypatch.setitem(sys.modules, 'cupy', gpu)
    return gpu


def on_host(x):
    if isinstance(x, tuple):
        return tuple(on_host(v) for v in x)
    if isinstance(x, dict):
        return {k: on_host(v) for k, v in x.items()}
    return x.get() if hasattr(x, 'get') else x


def float_batches(n, batch=6, seed=0):
    rng = numpy.random.default_rng(seed)
    return [[(rng.random(6, dtype=numpy.float32), numpy.int64(i * batch + j))
             for j in range(batch)] for i in range(n)]


def test_fields_of_one_batch_do_not_share_a_staging_buffer(fake):
    """x's copy is still queued when t is staged: t must not overwrite
    x's page-locked source."""
    converter = ConcatWithAsyncTransfer()
    batch = float_batches(1)[0]
    out = converter(batch, 0)
    assert same(on_host(out), concat_examples(batch))


def test_many_batches_without_synchronising_keep_every_value(fake):
    converter = ConcatWithAsyncTransfer()
    batches = float_batches(60)
    outs = [converter(b, 0) for b in batches]
    for out, b in zip(outs, batches):
        assert same(on_host(out), concat_examples(b))


def test_staging_memory_stays_bounded(fake):
    """Copies that have not run yet hold their staging buffer; beyond a
    few, the transfer waits for the oldest rather than allocating more."""
    converter = ConcatWithAsyncTransfer()
    batches = float_batches(200)
    for b in batches:
        converter(b, 0)
    assert 1 <= len(fake.pinned) <= 4
    assert set(fake.copies) == {'allocated'}


@pytest.mark.parametrize('kind', [SerialIterator, MultithreadIterator])
def test_prefetcher_over_host_iterators_keeps_every_value(fake, kind):
    dataset = Examples(50, 'tuple')
    kwargs = {'n_threads': 2} if kind is MultithreadIterator else {}
    with DevicePrefetcher(kind(dataset, 4, seed=7, **kwargs), 0,
                          depth=3) as it, \
            SerialIterator(dataset, 4, seed=7) as ref:
        outs = [next(it) for _ in range(30)]
        for out in outs:
            assert same(on_host(out), concat_examples(next(ref)))


def test_prefetcher_copies_straight_from_shared_memory(fake, method):
    """Stacked batches of a MultiprocessIterator are page-locked where they
    lie and copied from there; finalize() releases every registration."""
    dataset = Examples(60, 'tuple')
    with DevicePrefetcher(MultiprocessIterator(
            dataset, 4, n_processes=2, seed=3, converter=concat_examples,
            start_method=method), 0, depth=2) as it, \
            SerialIterator(dataset, 4, seed=3) as ref:
        for _ in range(20):
            # get() synchronises, as a training step's loss.item() would:
            # the batches handed out before are then retired, and their
            # shared memory is free for the workers again.
            assert same(on_host(next(it)), concat_examples(next(ref)))
        assert fake.registrations and fake.registered
        # After the first batch (which measures the layout and comes
        # through the socket), every field is copied from registered shared
        # memory, not through staging.
        assert fake.copies[3:] == ['registered'] * (len(fake.copies) - 3)
        assert it.copies == {'direct': len(fake.copies) - 3, 'staged': 3}
    assert fake.registered == {}


def test_successive_iterators_register_their_own_memory(fake, method):
    """Each iterator's shared memory is registered while it lives and
    unregistered before it is unmapped: a later iterator whose buffers land
    at the same addresses never meets a stale registration."""
    dataset = Examples(40, 'tuple')
    for round in range(3):
        before = len(fake.registrations)
        with DevicePrefetcher(MultiprocessIterator(
                dataset, 4, n_processes=1, seed=round,
                converter=concat_examples, start_method=method), 0,
                depth=1) as it, \
                SerialIterator(dataset, 4, seed=round) as ref:
            for _ in range(6):
                assert same(on_host(next(it)), concat_examples(next(ref)))
        assert len(fake.registrations) > before
        assert fake.registered == {}


def test_refused_registration_falls_back_to_staging(fake):
    fake.refuse_registration = True
    dataset = Examples(40, 'tuple')
    with pytest.warns(chainiter.SharedMemoryWarning, match='page-lock'):
        with DevicePrefetcher(MultiprocessIterator(
                dataset, 4, n_processes=1, seed=1, converter=concat_examples,
                start_method='fork'), 0, depth=2) as it, \
                SerialIterator(dataset, 4, seed=1) as ref:
            outs = [next(it) for _ in range(8)]
            for out in outs:
                assert same(on_host(out), concat_examples(next(ref)))
    assert fake.registered == {}


def test_a_bad_gpu_id_says_which_exist(fake):
    for call in (lambda: concat_examples([numpy.zeros(2)], device=3),
                 lambda: chainiter.to_device('@cupy:1', numpy.zeros(2)),
                 lambda: DevicePrefetcher(SerialIterator([1], 1), 2)):
        with pytest.raises(ValueError, match=r'GPU \d .*1 GPU.*0'):
            call()


def test_without_a_usable_gpu_the_error_says_how_to_fix(fake):
    fake.n_gpus = 0
    with pytest.raises(RuntimeError, match='no usable CUDA GPU.*device=None'):
        ConcatWithAsyncTransfer()([numpy.arange(3)], 0)


def test_gpu_arrays_are_recognised_in_a_fresh_process():
    """The user imported cupy; chainiter has not touched it yet."""
    script = textwrap.dedent('''
        import sys
        sys.path.insert(0, {tests!r})
        from fake_cupy import FakeCupy
        sys.modules['cupy'] = cupy = FakeCupy()
        import numpy
        import chainiter
        g = cupy.asarray(numpy.arange(3.0))
        assert chainiter.to_device(None, g) is g     # as Chainer
        back = chainiter.to_device('@numpy', g)
        assert type(back) is numpy.ndarray, type(back)
        nested = chainiter.to_device(-1, {{'a': [g]}})
        assert type(nested['a'][0]) is numpy.ndarray
        assert nested['a'][0].tolist() == [0, 1, 2]
        both = chainiter.concat_examples([g, g])
        assert isinstance(both, cupy.ndarray), type(both)
        assert both.get().tolist() == [[0, 1, 2], [0, 1, 2]]
        print('ok')
    ''').format(tests=str(__import__('pathlib').Path(__file__).parent))
    done = subprocess.run([sys.executable, '-c', script], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and 'ok' in done.stdout, done.stderr


# ---- on a real GPU --------------------------------------------------------

gpu = pytest.mark.gpu


@pytest.fixture
def cupy():
    if not cuda.is_available():
        pytest.skip('needs cupy and a CUDA GPU')
    import cupy
    return cupy


def host(x):
    if isinstance(x, tuple):
        return tuple(host(v) for v in x)
    if isinstance(x, dict):
        return {k: host(v) for k, v in x.items()}
    return x.get() if hasattr(x, 'get') else x


@gpu
@pytest.mark.parametrize('device', [0, '@cupy:0'])
def test_gpu_to_device_and_concat(cupy, device):
    batch = [(numpy.arange(i + 2, dtype=numpy.float32), i) for i in range(5)]
    out = concat_examples(batch, device=device, padding=-1)
    assert isinstance(out[0], cupy.ndarray)
    assert same(host(out), concat_examples(batch, padding=-1))
    nested = chainiter.to_device(cupy.cuda.Device(0), {'a': [numpy.ones(3)]})
    assert isinstance(nested['a'][0], cupy.ndarray)


@gpu
def test_gpu_async_converter_values_and_no_corruption(cupy):
    converter = ConcatWithAsyncTransfer()
    rng = numpy.random.default_rng(0)
    for _ in range(50):
        batch = [(rng.random((3, 64, 64), dtype=numpy.float32),
                  rng.integers(0, 10, size=rng.integers(1, 9)))
                 for _ in range(16)]
        out = converter(batch, 0, padding=0)
        expected = concat_examples(batch, padding=0)
        y = out[0] * 2      # compute on the current stream
        assert same(host(out), expected)
        numpy.testing.assert_array_equal(y.get(), expected[0] * 2)


@gpu
def test_gpu_prefetcher_from_shared_memory(cupy, method):
    dataset = Examples(64, 'tuple')
    with DevicePrefetcher(MultiprocessIterator(
            dataset, 8, n_processes=2, seed=1, converter=concat_examples,
            start_method=method), device=0, depth=2) as it, \
            SerialIterator(dataset, 8, seed=1) as ref:
        for _ in range(30):
            out = next(it)
            assert isinstance(out[0], cupy.ndarray)
            assert same(host(out), concat_examples(next(ref)))


@gpu
def test_gpu_copy_overlaps_compute(cupy):
    """The copy of batch k+1 runs on another stream than the compute on
    batch k, and the two overlap in time (CUDA events)."""
    big = [numpy.ones((64, 1024, 1024), dtype=numpy.float32)]
    converter = ConcatWithAsyncTransfer()
    transfer = converter.transfer_for(0)
    compute = cupy.cuda.get_current_stream()
    assert transfer.stream.ptr != compute.ptr
    x = converter(big, 0)
    start = compute.record()
    for _ in range(200):
        x = cupy.sqrt(x * x + 1)          # long compute on batch k
    compute_end = compute.record()
    ticket = transfer.issue(concat_examples(big))   # batch k + 1
    copy_end = transfer.stream.record()
    compute_end.synchronize()
    copy_end.synchronize()
    # The copy finished while the compute was still running.
    assert cupy.cuda.get_elapsed_time(start, copy_end) < \
        cupy.cuda.get_elapsed_time(start, compute_end)
    transfer.hand_out(ticket)


@gpu
def test_gpu_memory_does_not_grow(cupy):
    pool = cupy.get_default_memory_pool()
    converter = ConcatWithAsyncTransfer()
    batch = [numpy.ones((1024, 256), dtype=numpy.float32)] * 8
    for _ in range(20):
        converter(batch, 0)
    used = pool.used_bytes()
    for _ in range(200):
        converter(batch, 0)
    cupy.cuda.Device(0).synchronize()
    assert pool.used_bytes() <= used + 4 * 8 * 1024 * 256 * 4
