"""Converters: from a list of examples to a batch of arrays.

``concat_examples`` follows Chainer's rules: tuple examples are stacked field
by field into a tuple, dict examples key by key into a dict, arrays (and
scalars) into one array; ``padding`` pads ragged fields to the largest shape.
"""

import functools
from typing import Any, Callable

import numpy

from chainiter.backends import cuda
from chainiter.backends import torch as torch_backend
from chainiter.backends._device import TorchDevice, parse_device
from chainiter.dataset.stacked_examples import StackedExamples


def to_device(device: Any, x: Any) -> Any:
    """Send ``x`` (an array, or tuples/lists/dicts of them) to ``device``.

    As in Chainer, ``device`` None leaves the arrays where they are; -1 or
    ``'@numpy'`` is the host; an int GPU id, ``'@cupy:N'`` or a cupy
    ``Device`` is a GPU (needs the ``cuda`` extra).  ``'@torch'`` gives
    torch CPU tensors that share the arrays' memory (a copy only where
    torch cannot view an array: read-only, negative strides, a foreign byte
    order) and ``'@torch:cuda:N'`` torch tensors on CUDA GPU N (copied
    through page-locked memory); torch tensors come back to the host as
    numpy arrays with -1 or ``'@numpy'``.  Non-array leaves (None,
    numbers, strings) are returned as they are.
    """
    return _send(_destination(device), x)


def _destination(device):
    """None (leave arrays where they are), -1 (the host), a GPU id or a
    ``TorchDevice``."""
    if device is None:
        return None
    device_id = parse_device(device)
    if device_id is None:
        return -1
    if isinstance(device_id, TorchDevice):
        torch_backend.check_available(device_id.index)
    else:
        cuda.check_available(device_id)
    return device_id


def _send(destination, x, what=''):
    """``x`` sent to ``destination``; ``what`` names ``x`` in errors."""
    if destination is None:
        return x
    if isinstance(x, (list, tuple)):
        return _sequence_like(x, [_send(destination, item, what)
                                  for item in x])
    if isinstance(x, dict):
        return {key: _send(destination, value, what)
                for key, value in x.items()}
    if isinstance(destination, TorchDevice):
        if not (isinstance(x, numpy.ndarray) or cuda.is_gpu_array(x)
                or torch_backend.is_tensor(x)):
            return x
        if destination.index is None:
            return torch_backend.to_cpu_tensor(x, what)
        return torch_backend.to_cuda_tensor(x, destination.index, what)
    if destination == -1:
        if torch_backend.is_tensor(x):
            return torch_backend.to_numpy(x)
        return cuda.to_cpu(x) if cuda.is_gpu_array(x) else x
    if isinstance(x, numpy.ndarray) or cuda.is_gpu_array(x):
        return cuda.to_gpu(x, destination)
    return x


def _sequence_like(x, items):
    """``items`` in a sequence of the type of ``x``: a list batch of a
    ``MultiprocessIterator`` (a ``StackedExamples``, whose arrays the
    items no longer are) becomes a plain list, as it does when copied or
    pickled; a namedtuple takes the items as its fields."""
    kind = type(x)
    if kind is list or kind is StackedExamples:
        return items
    if kind is tuple:
        return tuple(items)
    if isinstance(x, tuple) and hasattr(kind, '_fields'):
        return kind(*items)
    return kind(items)


def _describe(example):
    if isinstance(example, tuple):
        return 'a tuple of {} fields'.format(len(example))
    if isinstance(example, dict):
        return 'a dict with keys {}'.format(sorted(example, key=str))
    return 'a {}'.format(type(example).__name__)


def _check_structure(batch):
    first = batch[0]
    for i, example in enumerate(batch):
        same = (
            (isinstance(example, tuple) and isinstance(first, tuple)
            and len(example) == len(first))
            or (isinstance(example, dict) and isinstance(first, dict)
            and example.keys() == first.keys())
            or (not isinstance(example, (tuple, dict))
            and not isinstance(first, (tuple, dict))))
        if not same:
            raise ValueError(
                'concat_examples needs examples of one structure, but '
                'example 0 is {} and example {} is {}'.format(
                    _describe(first), i, _describe(example)))


def concat_examples(batch: Any, device: Any = None,
                    padding: Any = None) -> Any:
    """Stack a list of examples into arrays (Chainer's ``concat_examples``).

    Args:
        batch (list): examples: all tuples of the same length, all dicts
            with the same keys, or all arrays/scalars.
        device: where to put the result (see ``to_device``); None leaves
            it where the examples are.
        padding: None to require equal shapes; otherwise the value ragged
            fields are padded with to the largest shape.  A tuple (for tuple
            examples) or dict (for dict examples) gives one value per field.

    Returns:
        A tuple, dict or array of stacked arrays, with the batch axis first.
    """
    if type(batch) is StackedExamples:
        # A MultiprocessIterator's list batch: its workers stacked it.
        stacked = batch.stacked_for(padding)
        if stacked is not None:
            return _send(_destination(device), stacked)
    if len(batch) == 0:
        raise ValueError('concat_examples got an empty batch; there is '
                         'nothing to stack')
    _check_structure(batch)
    destination = _destination(device)
    first = batch[0]
    if isinstance(first, tuple):
        if not isinstance(padding, tuple):
            padding = (padding,) * len(first)
        elif len(padding) != len(first):
            raise ValueError(
                'padding has {} values but the examples have {} fields'.format(
                    len(padding), len(first)))
        return tuple(
            _send(destination, _concat([example[i] for example in batch],
                                       padding[i], 'field {}'.format(i)),
                  'field {}'.format(i))
            for i in range(len(first)))
    if isinstance(first, dict):
        if not isinstance(padding, dict):
            padding = {key: padding for key in first}
        return {key: _send(destination, _concat(
                    [example[key] for example in batch], padding.get(key),
                    'key {!r}'.format(key)), 'key {!r}'.format(key))
                for key in first}
    return _send(destination, _concat(batch, padding, 'the examples'))


def _concat(arrays, padding, what):
    if cuda.is_gpu_array(arrays[0]):
        xp = cuda.check_available(None)
    else:
        xp = numpy
        if not isinstance(arrays[0], numpy.ndarray):
            return numpy.asarray(arrays)
    if padding is not None:
        return _concat_with_padding(xp, arrays, padding, what)
    shape = arrays[0].shape
    for i, array in enumerate(arrays):
        if array.shape != shape:
            raise ValueError(
                'cannot stack {}: example 0 has shape {} but example {} has '
                'shape {}; pass padding= to pad them to a common shape'.format(
                    what, shape, i, array.shape))
    return xp.stack(arrays)


def _concat_with_padding(xp, arrays, padding, what):
    ndim = arrays[0].ndim
    shape = list(arrays[0].shape)
    for i, array in enumerate(arrays):
        if array.ndim != ndim:
            raise ValueError(
                'cannot pad {}: example 0 has {} dimensions but example {} '
                'has {}'.format(what, ndim, i, array.ndim))
        shape = [max(a, b) for a, b in zip(shape, array.shape)]
    result = xp.full([len(arrays)] + shape, padding, dtype=arrays[0].dtype)
    for i, array in enumerate(arrays):
        result[(i,) + tuple(slice(d) for d in array.shape)] = array
    return result


class Converter:
    """Base class of converters: callables ``converter(batch, device=None)``."""

    def __call__(self, batch: Any,
                 device: Any = None) -> Any:
        raise NotImplementedError


class _FunctionConverter(Converter):

    def __init__(self, func):
        self._func = func
        functools.update_wrapper(self, func)

    def __call__(self, batch, device=None):
        return self._func(batch, device)


def converter() -> Callable[[Callable[..., Any]], Converter]:
    """Decorator that turns ``f(batch, device)`` into a ``Converter``.

    Use it as::

        @chainiter.converter()
        def my_converter(batch, device):
            ...
    """
    return _FunctionConverter
