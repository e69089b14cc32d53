import functools
import importlib.util

import numpy
import pytest

import chainiter
from chainiter import concat_examples, to_device
from chainiter.backends._device import parse_device


def test_tuple_examples_stacked_field_by_field():
    batch = [(numpy.full(2, i, dtype=numpy.float32), i) for i in range(3)]
    x, t = concat_examples(batch)
    assert x.shape == (3, 2) and x.dtype == numpy.float32
    numpy.testing.assert_array_equal(x[:, 0], [0, 1, 2])
    numpy.testing.assert_array_equal(t, [0, 1, 2])


def test_dict_examples_stacked_key_by_key():
    batch = [{'x': numpy.ones(2) * i, 'y': numpy.int32(i)} for i in range(3)]
    out = concat_examples(batch)
    assert set(out) == {'x', 'y'}
    assert out['x'].shape == (3, 2)
    numpy.testing.assert_array_equal(out['y'], [0, 1, 2])
    assert out['y'].dtype == numpy.int32


def test_bare_arrays_and_scalars():
    out = concat_examples([numpy.arange(3), numpy.arange(3)])
    assert out.shape == (2, 3)
    numpy.testing.assert_array_equal(concat_examples([1.5, 2.5]), [1.5, 2.5])


def test_padding_single_value():
    batch = [(numpy.arange(2), numpy.ones((1, 3))),
             (numpy.arange(4), numpy.ones((2, 1)))]
    x, y = concat_examples(batch, padding=-1)
    numpy.testing.assert_array_equal(x, [[0, 1, -1, -1], [0, 1, 2, 3]])
    assert y.shape == (2, 2, 3)
    numpy.testing.assert_array_equal(y[1], [[1, -1, -1], [1, -1, -1]])


def test_padding_per_field():
    batch = [(numpy.arange(1), numpy.arange(1)),
             (numpy.arange(2), numpy.arange(2))]
    x, y = concat_examples(batch, padding=(0, 9))
    numpy.testing.assert_array_equal(x, [[0, 0], [0, 1]])
    numpy.testing.assert_array_equal(y, [[0, 9], [0, 1]])
    out = concat_examples([{'a': numpy.arange(1)}, {'a': numpy.arange(2)}],
                          padding={'a': 7})
    numpy.testing.assert_array_equal(out['a'], [[0, 7], [0, 1]])


def test_empty_batch():
    with pytest.raises(ValueError, match='empty batch'):
        concat_examples([])


@pytest.mark.parametrize('batch,message', [
    ([(1, 2), {'a': 1}], 'tuple of 2 fields.*dict'),
    ([(1, 2), (1, 2, 3)], 'tuple of 2 fields.*tuple of 3 fields'),
    ([{'a': 1}, {'b': 1}], "keys \\['a'\\].*keys \\['b'\\]"),
    ([numpy.zeros(2), (1, 2)], 'ndarray.*tuple'),
])
def test_mixed_structures(batch, message):
    with pytest.raises(ValueError, match=message):
        concat_examples(batch)


def test_ragged_without_padding_says_to_pad():
    with pytest.raises(ValueError, match='shape.*padding='):
        concat_examples([numpy.zeros(2), numpy.zeros(3)])


def test_host_devices_leave_arrays_alone():
    x = numpy.arange(3)
    for device in (None, -1, '@numpy'):
        assert to_device(device, x) is x
        assert concat_examples([x, x], device=device).shape == (2, 3)
    nested = to_device(-1, {'a': (x, [x]), 'b': 3})
    assert nested['a'][0] is x and nested['a'][1][0] is x and nested['b'] == 3


@pytest.mark.parametrize('spec,expected', [
    (None, None), (-1, None), ('@numpy', None), (0, 0), (3, 3),
    ('@cupy:1', 1), (numpy.int64(2), 2)])
def test_parse_device(spec, expected):
    assert parse_device(spec) == expected


@pytest.mark.parametrize('spec', ['@cupy', '@cupy:x', 'gpu', -2, 1.0, True])
def test_bad_device(spec):
    with pytest.raises((ValueError, TypeError), match='device'):
        parse_device(spec)


def test_gpu_without_cupy_names_the_cuda_extra():
    if importlib.util.find_spec('cupy') is not None:
        pytest.skip('cupy is installed')
    with pytest.raises(RuntimeError, match=r'chainiter\[cuda\]'):
        to_device(0, numpy.arange(3))
    with pytest.raises(RuntimeError, match=r'chainiter\[cuda\]'):
        concat_examples([numpy.arange(3)], device='@cupy:0')


def test_converter_decorator_and_base():
    @chainiter.converter()
    def double(batch, device=None):
        return concat_examples(batch, device) * 2

    assert isinstance(double, chainiter.Converter)
    numpy.testing.assert_array_equal(double([1, 2]), [2, 4])
    assert double.__name__ == 'double'
    padded = functools.partial(concat_examples, padding=0)
    assert padded([numpy.arange(1), numpy.arange(2)]).shape == (2, 2)
