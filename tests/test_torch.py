"""Torch tensors as a device: ``'@torch'`` (CPU tensors that share the
batch's memory) and ``'@torch:cuda:N'``.  The tests that need torch skip
where it does not import; those on a CUDA GPU are marked ``gpu``."""

import subprocess
import sys

import numpy
import pytest

from chainiter import (
    ConcatWithAsyncTransfer,
    DevicePrefetcher,
    MultiprocessIterator,
    SerialIterator,
    concat_examples,
    to_device,
)
from chainiter.backends._device import TorchDevice, parse_device

from helpers import Examples, _is_buffer


# ---- without torch ---------------------------------------------------------

@pytest.mark.parametrize('spec,index', [
    ('@torch', None), ('@torch:cpu', None), ('@torch:cuda:0', 0),
    ('@torch:cuda:3', 3)])
def test_parse_torch_devices(spec, index):
    assert parse_device(spec) == TorchDevice(index)
    assert parse_device(parse_device(spec)) == TorchDevice(index)
    assert str(parse_device(spec)) == \
        '@torch' if index is None else '@torch:cuda:{}'.format(index)


@pytest.mark.parametrize('spec', ['@torch:', '@torch:cuda', '@torch:cuda:',
                                  '@torch:cuda:x', '@torch:gpu:0',
                                  '@torch:cuda:-1', '@torchx'])
def test_bad_torch_devices_say_what_is_accepted(spec):
    with pytest.raises(ValueError, match="'@torch:cuda:N'") as e:
        parse_device(spec)
    assert repr(spec) in str(e.value)


def test_without_torch_the_error_says_how_to_install_it():
    # torch made unimportable, whether it is installed or not.
    code = (
        'import sys; sys.modules["torch"] = None\n'
        'import numpy, chainiter\n'
        'for call in (\n'
        '        lambda: chainiter.to_device("@torch", numpy.zeros(2)),\n'
        '        lambda: chainiter.concat_examples([1, 2], "@torch:cuda:0"),\n'
        '        lambda: chainiter.DevicePrefetcher(\n'
        '            chainiter.SerialIterator([1, 2], 1), "@torch")):\n'
        '    try:\n'
        '        call()\n'
        '    except RuntimeError as e:\n'
        '        print(e)\n')
    out = subprocess.run([sys.executable, '-c', code], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    lines = out.splitlines()
    assert len(lines) == 3, out
    for line in lines:
        assert 'torch cannot be imported' in line and \
            'pip install torch' in line, line
    assert "'@torch:cuda:0' was asked for" in lines[1]


# ---- with torch (CPU) ------------------------------------------------------

@pytest.fixture
def torch():
    return pytest.importorskip('torch')


def test_to_device_gives_tensors_sharing_the_arrays(torch):
    x = numpy.arange(6, dtype=numpy.float32).reshape(2, 3)
    y = numpy.arange(3)
    out = to_device('@torch', {'a': (x, [y]), 'b': 3, 'c': None, 'd': 'n'})
    tx, ty = out['a'][0], out['a'][1][0]
    assert isinstance(out['a'], tuple) and isinstance(out['a'][1], list)
    assert (out['b'], out['c'], out['d']) == (3, None, 'n')
    assert tx.dtype == torch.float32 and tuple(tx.shape) == (2, 3)
    assert ty.dtype == torch.int64 and tx.device.type == 'cpu'
    x[1, 2] = 50
    y[0] = -4
    assert tx[1, 2].item() == 50 and ty[0].item() == -4
    assert to_device('@torch:cpu', x).data_ptr() == x.ctypes.data


def test_concat_examples_to_torch(torch):
    batch = [Examples(5, 'mixed')[i] for i in range(4)]
    for example in batch:
        del example['name']
    out = concat_examples(batch, device='@torch', padding=0)
    ref = concat_examples(batch, padding=0)
    assert sorted(out) == sorted(ref)
    for key in ('x', 'seq', 'label'):
        assert isinstance(out[key], torch.Tensor)
        assert numpy.array_equal(out[key].numpy(), ref[key])
    assert out['seq'].dtype == torch.int16
    batch = [Examples(5, 'tuple')[i] for i in range(4)]
    out = concat_examples(batch, device='@torch')
    assert isinstance(out, tuple) and \
        [t.dtype for t in out] == [torch.float32, torch.int32, torch.float64]


def test_async_converter_to_torch(torch):
    batch = [(numpy.arange(i + 1), i) for i in range(3)]
    x, t = ConcatWithAsyncTransfer()(batch, '@torch', padding=0)
    assert isinstance(x, torch.Tensor) and x.tolist() == \
        concat_examples(batch, padding=0)[0].tolist()
    assert t.tolist() == [0, 1, 2]


def test_serial_iterator_batches_share_memory_with_their_tensors(torch):
    with SerialIterator(Examples(10, 'tuple'), 4, seed=0) as it:
        for _ in range(3):
            host = concat_examples(next(it))
            tensors = to_device('@torch', host)
            host[0][0, 1, 2] = 1000
            assert tensors[0][0, 1, 2].item() == 1000
            assert [t.data_ptr() for t in tensors] == \
                [a.ctypes.data for a in host]


def _shared_ranges():
    """The address ranges of this process's shared-memory buffers."""
    ranges = []
    with open('/proc/self/maps') as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and _is_buffer(fields[5].rstrip('\n')):
                start, end = (int(a, 16) for a in fields[0].split('-'))
                ranges.append((start, end))
    return ranges


def _in_shared_memory(tensor):
    address = tensor.data_ptr()
    return any(start <= address < end for start, end in _shared_ranges())


def test_multiprocess_batches_share_memory_with_their_tensors(torch,
                                                              method):
    dataset = Examples(40, 'tuple')
    kept = []
    with MultiprocessIterator(dataset, 4, n_processes=2, seed=3,
                              shuffle=False, converter=concat_examples,
                              start_method=method) as it:
        for i in range(10):
            host = next(it)
            x, label, half = to_device('@torch', host)
            if i > 0:                     # the first batch came by copy
                assert _in_shared_memory(x)
            host[0][0, 0, 0] = -1
            assert x[0, 0, 0].item() == -1
            kept.append((i, x, label, half))
        # Tensors kept while the workers write further batches keep their
        # values: they hold the batch's shared memory.
        for _ in range(10):
            next(it)
        for i, x, label, half in kept:
            ref = concat_examples([dataset[j] for j in range(4 * i,
                                                             4 * i + 4)])
            ref[0][0, 0, 0] = -1
            assert numpy.array_equal(x.numpy(), ref[0])
            assert numpy.array_equal(label.numpy(), ref[1])
            assert numpy.array_equal(half.numpy(), ref[2])


def _check_prefetcher_to_torch(torch, inner, dataset, shared):
    with DevicePrefetcher(inner, '@torch', depth=2) as it, \
            SerialIterator(dataset, 4, seed=2) as ref:
        for i in range(12):
            batch = next(it)
            expected = concat_examples(next(ref))
            assert isinstance(batch['x'], torch.Tensor)
            assert numpy.array_equal(batch['x'].numpy(), expected['x'])
            assert batch['label'].tolist() == expected['label'].tolist()
            if shared and i > 0:          # the first batch came by copy
                assert _in_shared_memory(batch['x'])
        assert it.copies is None


def test_prefetcher_to_torch(torch):
    dataset = Examples(30, 'dict')
    _check_prefetcher_to_torch(
        torch, SerialIterator(dataset, 4, seed=2), dataset, False)


def test_prefetcher_to_torch_from_shared_memory(torch, method):
    dataset = Examples(30, 'dict')
    _check_prefetcher_to_torch(
        torch, MultiprocessIterator(dataset, 4, n_processes=2, seed=2,
                                    converter=concat_examples,
                                    start_method=method), dataset, True)


def test_read_only_arrays_are_copied_without_a_warning(torch):
    # (warnings are errors in the tests)
    x = numpy.arange(4.0)
    x.flags.writeable = False
    t = to_device('@torch', x)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert t.data_ptr() != x.ctypes.data
    t[0] = 9                                      # the copy is the tensor's
    assert x[0] == 0


@pytest.mark.parametrize('make', [
    lambda: numpy.arange(12.0).reshape(3, 4)[::-1, ::2],        # negative
    lambda: numpy.zeros(4, dtype=[('a', 'f4'), ('b', 'i1')])['a'],  # stride 5
    lambda: numpy.arange(6, dtype='>i4'),                       # big-endian
    lambda: numpy.arange(6, dtype='>f8').reshape(2, 3).T,
])
def test_arrays_torch_cannot_view_are_converted(torch, make):
    x = make()
    t = to_device('@torch', x)
    assert numpy.array_equal(t.numpy(), x)
    assert t.numpy().dtype == x.dtype.newbyteorder('=')


@pytest.mark.parametrize('dtype', ['bool', 'float16', 'uint8', 'int8',
                                   'complex64', 'uint16'])
def test_other_dtypes_share_memory(torch, dtype):
    x = numpy.zeros((2, 3), dtype=dtype)
    t = to_device('@torch', x)
    assert t.numpy().dtype == x.dtype and t.data_ptr() == x.ctypes.data


@pytest.mark.parametrize('x', [
    numpy.array([{'a': 1}, None], dtype=object),
    numpy.array(['ab', 'c']),
    numpy.zeros(2, dtype=[('a', 'f4'), ('b', 'i1')]),
    numpy.array(['2020-01-01'], dtype='datetime64[D]'),
])
def test_arrays_torch_cannot_hold_are_a_clear_error(torch, x):
    with pytest.raises(TypeError, match='torch') as e:
        to_device('@torch', (x,))
    assert str(x.dtype) in str(e.value) and str(x.shape) in str(e.value)
    with pytest.raises(TypeError, match='field 1'):
        concat_examples([(numpy.zeros(2), item) for item in x], '@torch')


def test_tensors_to_the_host(torch):
    t = torch.arange(4)
    x = to_device('@numpy', {'t': t})['t']
    assert isinstance(x, numpy.ndarray) and x.ctypes.data == t.data_ptr()
    assert to_device(None, t) is t and to_device('@torch', t) is t


def test_cuda_without_a_gpu_says_so(torch):
    if torch.cuda.is_available():
        pytest.skip('a CUDA GPU is present')
    pattern = (r"'@torch:cuda:0' was asked for, but "
               r"torch.cuda.is_available\(\) is False")
    with pytest.raises(RuntimeError, match=pattern):
        to_device('@torch:cuda:0', numpy.zeros(2))
    with pytest.raises(RuntimeError, match=pattern):
        concat_examples([numpy.zeros(2)], device='@torch:cuda:0')
    with pytest.raises(RuntimeError, match=pattern):
        DevicePrefetcher(SerialIterator([1, 2], 1), '@torch:cuda:0')
    with pytest.raises(RuntimeError, match=pattern):
        ConcatWithAsyncTransfer()([numpy.zeros(2)], '@torch:cuda:0')


# ---- on a CUDA GPU ---------------------------------------------------------

@pytest.fixture
def torch_cuda():
    torch = pytest.importorskip('torch')
    if not torch.cuda.is_available():
        pytest.skip('torch sees no CUDA GPU')
    return torch


@pytest.mark.gpu
def test_gpu_torch_to_device_and_concat(torch_cuda):
    torch = torch_cuda
    x = numpy.arange(6, dtype='>f4').reshape(2, 3)[:, ::-1]
    t = to_device('@torch:cuda:0', {'x': x, 'n': 1})
    assert t['x'].device == torch.device('cuda', 0) and t['n'] == 1
    assert numpy.array_equal(t['x'].cpu().numpy(), x)
    out = concat_examples([(x, 1), (x, 2)], device='@torch:cuda:0')
    assert out[1].device.type == 'cuda' and out[1].tolist() == [1, 2]
    with pytest.raises(ValueError, match='does not exist'):
        to_device('@torch:cuda:{}'.format(torch.cuda.device_count()), x)


@pytest.mark.gpu
def test_gpu_torch_prefetcher_keeps_every_value(torch_cuda, method):
    torch = torch_cuda
    dataset = Examples(64, 'tuple')
    with DevicePrefetcher(MultiprocessIterator(
            dataset, 8, n_processes=2, seed=1, converter=concat_examples,
            start_method=method), '@torch:cuda:0', depth=3) as it, \
            SerialIterator(dataset, 8, seed=1) as ref:
        for _ in range(20):
            x, label, half = next(it)
            x = x * 2                 # compute on the current stream
            expected = concat_examples(next(ref))
            assert x.device == torch.device('cuda', 0)
            assert numpy.array_equal(x.cpu().numpy(), expected[0] * 2)
            assert label.cpu().tolist() == expected[1].tolist()
        assert it.copies['staged'] > 0
