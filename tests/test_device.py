"""Device transfer: the host paths everywhere, the GPU paths where cupy and a
GPU are present (marked ``gpu``; run with ``python -m pytest -m gpu``)."""


import functools
import gc
import io
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
from chainiter.dataset._pinning import shared_region

from fake_cupy import FakeCupy
from helpers import (
    AugmentedDataset,
    Examples,
    Failing,
    InterruptsOnce,
    RaisesOnce,
    assert_resume_equivalent,
    fingerprint,
    mapped_buffers,
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


def _through_raises(it, n, error):
    """``n`` batches from ``it`` (fingerprints), calling again after each
    ``error``; each call that raises must leave the position, the
    attributes and the snapshot as they were.  Returns the batches and
    how many calls raised."""
    got, raised = [], 0
    while len(got) < n:
        before = ([getattr(it, name) for name in (
            'epoch', 'current_position', 'is_new_epoch', 'epoch_detail',
            'previous_epoch_detail')], it.state_dict())
        try:
            got.append(fingerprint(next(it)))
        except error:
            raised += 1
            after = ([getattr(it, name) for name in (
                'epoch', 'current_position', 'is_new_epoch', 'epoch_detail',
                'previous_epoch_detail')], it.state_dict())
            assert after[0] == before[0]
            assert after[1].keys() == before[1].keys()
            for key in before[1]:
                numpy.testing.assert_array_equal(after[1][key],
                                                 before[1][key])
    return got, raised


def _expected(dataset, n, **kwargs):
    with SerialIterator(dataset, BATCH, **kwargs) as ref:
        return [fingerprint(concat_examples(next(ref))) for _ in range(n)]


@pytest.mark.parametrize('error', [KeyboardInterrupt, ArithmeticError])
@pytest.mark.parametrize('at', [0, 1, 2, 3, 6])
@pytest.mark.parametrize('depth', [0, 2])
def test_prefetcher_call_that_raises_keeps_the_position_and_every_batch(
        depth, at, error):
    """A Ctrl-C (or an error) in the converter, after the batch was taken
    from the wrapped iterator: that call raises, the position stays, and
    every batch arrives once, in order."""
    dataset = AugmentedDataset(N)
    with DevicePrefetcher(SerialIterator(dataset, BATCH, seed=1),
                          depth=depth, converter=RaisesOnce(at, error)) as it:
        got, raised = _through_raises(it, 9, error)
    assert raised == 1
    assert got == _expected(dataset, 9, seed=1)


@pytest.mark.parametrize('index', [0, 5, 9])
@pytest.mark.parametrize('depth', [0, 2])
def test_prefetcher_ctrl_c_while_the_iterator_loads_loses_no_batch(
        depth, index):
    dataset = InterruptsOnce(N, index)
    with DevicePrefetcher(SerialIterator(dataset, BATCH, shuffle=False,
                                         seed=1), depth=depth) as it:
        got, raised = _through_raises(it, 9, KeyboardInterrupt)
    assert raised == 1
    assert got == _expected(AugmentedDataset(N), 9, shuffle=False, seed=1)


@pytest.mark.parametrize('at', [0, 2, 5])
def test_prefetcher_ctrl_c_over_a_multiprocess_iterator_loses_no_batch(
        method, at):
    dataset = AugmentedDataset(N)
    with DevicePrefetcher(MultiprocessIterator(
            dataset, BATCH, n_processes=2, seed=1, start_method=method),
            depth=2, converter=RaisesOnce(at, KeyboardInterrupt)) as it:
        got, raised = _through_raises(it, 9, KeyboardInterrupt)
    assert raised == 1
    assert got == _expected(dataset, 9, seed=1)


def _example_that_cannot_be_loaded(make):
    """dataset[42] raises, batches of 4, depth 2: batches 0-9 arrive, the
    11th call raises (and every later one), at position 40, as without the
    prefetcher."""
    dataset = Failing(60, 42)
    with DevicePrefetcher(make(dataset, 4, shuffle=False), depth=2) as it:
        got = [next(it)[:, 0].tolist() for _ in range(10)]
        assert got == [list(range(4 * b, 4 * b + 4)) for b in range(10)]
        for _ in range(3):
            with pytest.raises(KeyError, match='broken example 42'):
                next(it)
            assert (it.epoch, it.current_position) == (0, 40)
            assert it.state_dict()['current_position'] == 40
        f = io.BytesIO()
        chainiter.serializers.save_npz(f, it)
    with SerialIterator(list(range(60)), 4, shuffle=False) as plain:
        chainiter.serializers.load_npz(io.BytesIO(f.getvalue()), plain)
        assert next(plain) == [40, 41, 42, 43]


@pytest.mark.parametrize('kind', [SerialIterator, MultithreadIterator],
                         ids=['serial', 'thread'])
def test_prefetcher_raises_an_examples_error_in_its_turn(kind):
    _example_that_cannot_be_loaded(kind)


def test_prefetcher_raises_an_examples_error_in_its_turn_multiprocess(
        method):
    _example_that_cannot_be_loaded(functools.partial(
        MultiprocessIterator, n_processes=2, start_method=method))


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


@pytest.mark.parametrize('error', [KeyboardInterrupt, ArithmeticError])
@pytest.mark.parametrize('at', [0, 2, 5])
def test_prefetcher_to_a_gpu_call_that_raises_keeps_every_batch(
        fake, at, error):
    """As on the host, with copies issued and handed out (and dropped when
    the batches fetched ahead are fetched again)."""
    dataset = Examples(50, 'tuple')
    with DevicePrefetcher(SerialIterator(dataset, 4, seed=7), 0, depth=3,
                          converter=RaisesOnce(at, error)) as it, \
            SerialIterator(dataset, 4, seed=7) as ref:
        outs, raised = [], 0
        while len(outs) < 12:
            position = (it.epoch, it.current_position)
            try:
                outs.append(next(it))
            except error:
                raised += 1
                assert (it.epoch, it.current_position) == position
        assert raised == 1
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


def test_dropped_converters_wait_for_their_copies(fake):
    """A converter dropped while its copies are queued gives its staging
    buffers back to the pool only after they ran: the next converter's
    buffers (same addresses) must not overwrite what they still read."""
    batches = float_batches(12)
    outs = []
    for batch in batches:
        outs.append(ConcatWithAsyncTransfer()(batch, 0))
        gc.collect()
    for out, batch in zip(outs, batches):
        assert same(on_host(out), concat_examples(batch))


def test_prefetcher_from_shared_memory_without_synchronising(fake, method):
    """Shared memory a queued copy reads is not refilled by the workers."""
    dataset = Examples(80, 'tuple')
    with DevicePrefetcher(MultiprocessIterator(
            dataset, 4, n_processes=2, seed=3, converter=concat_examples,
            start_method=method), 0, depth=2) as it, \
            SerialIterator(dataset, 4, seed=3) as ref:
        outs = [next(it) for _ in range(15)]
        assert it.copies['direct'] > 0
        for out in outs:
            assert same(on_host(out), concat_examples(next(ref)))


def test_finalize_lets_go_of_shared_memory_and_staging(fake, method):
    """The batches handed out are on the device: once finalized, nothing
    of the iterator stays mapped, registered or page-locked."""
    dataset = Examples(80, 'tuple')
    before = mapped_buffers()     # (pytest's capture files look alike)
    it = DevicePrefetcher(MultiprocessIterator(
        dataset, 4, n_processes=2, seed=3, converter=concat_examples,
        start_method=method), 0, depth=3)
    batches = [next(it) for _ in range(10)]
    it.finalize()
    gc.collect()
    assert mapped_buffers() == before
    assert fake.registered == {}
    assert it._transfer.staging_bytes == 0
    assert len(batches) == 10


def test_a_failed_staging_allocation_is_not_remembered(fake):
    converter = ConcatWithAsyncTransfer()
    batch = float_batches(1)[0]
    fake.fail_pinned = 1
    with pytest.raises(fake.cuda.runtime.CUDARuntimeError):
        converter(batch, 0)
    assert same(on_host(converter(batch, 0)), concat_examples(batch))


def test_no_release_callback_after_release():
    from chainiter.iterators.pipeline.memory.shm import SharedBuffer
    shared = SharedBuffer.allocate(4096)
    calls = []
    assert shared.when_released(lambda: calls.append(1))
    shared.release()
    assert calls == [1]
    assert not shared.when_released(lambda: calls.append(2))
    assert calls == [1] and shared.region() is None


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
#
# bash tests/gpu_check.sh runs these (python -m pytest -m gpu).

gpu = pytest.mark.gpu


@pytest.fixture
def cupy():
    if not cuda.is_available():
        pytest.skip('needs cupy and a CUDA GPU')
    import cupy
    return cupy


def registered(cupy, address):
    """Whether CUDA holds a host registration at ``address`` (which may no
    longer be mapped)."""
    attributes = cupy.cuda.runtime.pointerGetAttributes(address)
    return attributes.type == cupy.cuda.runtime.memoryTypeHost


@gpu
@pytest.mark.parametrize('device', [0, '@cupy:0'])
def test_gpu_to_device_and_concat(cupy, device):
    batch = [(numpy.arange(i + 2, dtype=numpy.float32), i) for i in range(5)]
    out = concat_examples(batch, device=device, padding=-1)
    assert isinstance(out[0], cupy.ndarray)
    assert same(on_host(out), concat_examples(batch, padding=-1))
    nested = chainiter.to_device(cupy.cuda.Device(0), {'a': [numpy.ones(3)]})
    assert isinstance(nested['a'][0], cupy.ndarray)
    back = chainiter.to_device(-1, nested)
    assert type(back['a'][0]) is numpy.ndarray
    assert chainiter.to_device(None, nested['a'][0]) is nested['a'][0]
    g = cupy.arange(3)
    assert isinstance(concat_examples([g, g]), cupy.ndarray)


@gpu
def test_gpu_bad_device_id(cupy):
    count = cupy.cuda.runtime.getDeviceCount()
    with pytest.raises(ValueError, match='GPU {} does not exist'.format(
            count)):
        concat_examples([numpy.zeros(2)], device=count)


@gpu
def test_gpu_async_converter_without_synchronising_keeps_every_value(cupy):
    """Many batches issued back to back, each used by a kernel on the
    compute stream, nothing synchronised until the end: a staging buffer
    or device array reused too early would show in the values."""
    converter = ConcatWithAsyncTransfer()
    transfer = converter.transfer_for(0)
    rng = numpy.random.default_rng(0)
    batches = [[(rng.random((3, 64, 64), dtype=numpy.float32),
                 rng.integers(0, 10, size=5))
                for _ in range(16)] for _ in range(150)]
    stall = cupy.ones(2 ** 25, dtype=numpy.float32)
    results = []
    for batch in batches:
        # Work queued on the side stream first holds the copies back, as
        # copies queued behind one another would: the host then stages
        # the next field and batch while the copy before has not run.
        with transfer.stream:
            for _ in range(4):
                stall = cupy.sqrt(stall)
        x, t = converter(batch, 0)
        results.append((x * 2, t + 1, x.sum()))
    cupy.cuda.Device(0).synchronize()
    for batch, (x2, t1, total) in zip(batches, results):
        x, t = concat_examples(batch)
        numpy.testing.assert_array_equal(x2.get(), x * 2)
        numpy.testing.assert_array_equal(t1.get(), t + 1)
        numpy.testing.assert_allclose(float(total), x.sum(dtype=numpy.float64),
                                      rtol=1e-4)
    assert transfer.staging_bytes <= 4 * 2 * 16 * 3 * 64 * 64 * 4


@gpu
@pytest.mark.parametrize('kind', [SerialIterator, MultithreadIterator])
def test_gpu_prefetcher_over_host_iterators(cupy, kind):
    dataset = AugmentedDataset(300)
    kwargs = {'n_threads': 2} if kind is MultithreadIterator else {}
    with DevicePrefetcher(kind(dataset, 8, seed=4, **kwargs), 0,
                          depth=3) as it, \
            SerialIterator(dataset, 8, seed=4) as ref:
        outs = [next(it) for _ in range(80)]          # no synchronising
        expected = [concat_examples(next(ref)) for _ in range(80)]
        assert all(same(on_host(o), e) for o, e in zip(outs, expected))
        assert it.copies['direct'] == 0 and it.copies['staged'] > 0


@gpu
def test_gpu_prefetcher_copies_from_shared_memory(cupy, method):
    dataset = Examples(64, 'tuple')
    with DevicePrefetcher(MultiprocessIterator(
            dataset, 8, n_processes=2, seed=1, converter=concat_examples,
            start_method=method), device=0, depth=2) as it, \
            SerialIterator(dataset, 8, seed=1) as ref:
        for _ in range(30):
            out = next(it)
            assert isinstance(out[0], cupy.ndarray)
            assert same(on_host(out), concat_examples(next(ref)))
        # The first batches measure the layout and come through the socket.
        assert it.copies['direct'] >= 3 * 25, it.copies


@gpu
def test_gpu_registrations_end_with_their_iterator(cupy, method):
    """Successive iterators in one process: each one's shared memory is
    page-locked while it lives, and no registration outlives its iterator
    (a later mapping at the same address must not meet a stale one)."""
    dataset = Examples(64, 'tuple')
    transfer = ConcatWithAsyncTransfer().transfer_for(0)
    for round in range(3):
        addresses = set()
        with MultiprocessIterator(
                dataset, 8, n_processes=2, seed=round,
                converter=concat_examples, start_method=method) as it, \
                SerialIterator(dataset, 8, seed=round) as ref:
            for _ in range(20):
                batch = next(it)
                region = shared_region(batch[0])
                if region is not None:
                    addresses.add(region[0])
                out = transfer.hand_out(transfer.issue(batch))
                del batch
                assert same(on_host(out), concat_examples(next(ref)))
            assert addresses
            assert all(registered(cupy, a) for a in addresses)
        assert not any(registered(cupy, a) for a in addresses)


@gpu
def test_gpu_registration_refused_falls_back(cupy):
    """Memory CUDA will not register (here: already registered by someone
    else) is copied through staging, with a warning, and stays correct."""
    dataset = Examples(32, 'tuple')
    with MultiprocessIterator(dataset, 4, n_processes=1, seed=0,
                              converter=concat_examples) as it, \
            SerialIterator(dataset, 4, seed=0) as ref:
        for _ in range(6):
            batch, expected = next(it), concat_examples(next(ref))
            region = shared_region(batch[0])
            if region is not None:
                break
        cupy.cuda.runtime.hostRegister(region[0], region[1], 0)
        try:
            transfer = ConcatWithAsyncTransfer().transfer_for(0)
            with pytest.warns(chainiter.SharedMemoryWarning,
                              match='page-lock'):
                out = transfer.hand_out(transfer.issue(batch))
            assert same(on_host(out), expected)
            assert transfer.copies == {'direct': 0, 'staged': 3}
        finally:
            cupy.cuda.runtime.hostUnregister(region[0])


@gpu
def test_gpu_copy_overlaps_compute(cupy):
    """The copy of batch k+1 runs on another stream than the compute on
    batch k, and the two overlap in time (CUDA events).  The host batch is
    built before the timed region; the compute lasts far longer than the
    host's share of issuing the copy."""
    converter = ConcatWithAsyncTransfer()
    transfer = converter.transfer_for(0)
    compute = cupy.cuda.get_current_stream()
    assert transfer.stream.ptr != compute.ptr
    batch = numpy.ones((16, 1024, 1024), dtype=numpy.float32)   # 64 MiB
    transfer.hand_out(transfer.issue(batch))      # warms pools and staging
    a = cupy.random.random((4096, 4096), dtype=numpy.float32)
    cupy.cuda.Device(0).synchronize()
    start = compute.record()
    for _ in range(60):
        a = a @ a
        a /= cupy.abs(a).max() + 1
    compute_end = compute.record()
    copy_start = transfer.stream.record()
    ticket = transfer.issue(batch)                 # batch k + 1
    copy_end = transfer.stream.record()
    compute_end.synchronize()
    copy_end.synchronize()
    copy_ms = cupy.cuda.get_elapsed_time(copy_start, copy_end)
    compute_ms = cupy.cuda.get_elapsed_time(start, compute_end)
    # The copy began and finished while the compute was still running.
    assert cupy.cuda.get_elapsed_time(start, copy_end) < compute_ms, (
        copy_ms, compute_ms)
    assert copy_ms < compute_ms
    assert same(on_host(transfer.hand_out(ticket)), batch)


@gpu
def test_gpu_memory_does_not_grow(cupy):
    pool = cupy.get_default_memory_pool()
    converter = ConcatWithAsyncTransfer()
    batch = [numpy.ones((1024, 256), dtype=numpy.float32)] * 8
    for _ in range(20):
        converter(batch, 0)
    used = pool.used_bytes()
    staging = converter.transfer_for(0).staging_bytes
    for _ in range(200):
        converter(batch, 0)
    cupy.cuda.Device(0).synchronize()
    assert pool.used_bytes() <= used + 4 * 8 * 1024 * 256 * 4
    assert converter.transfer_for(0).staging_bytes <= max(
        staging, 4 * 8 * 1024 * 256 * 4 + 4096)
