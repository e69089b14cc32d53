"""Parsing of Chainer's device specifiers, and chainiter's for torch."""

import collections

import numpy


class TorchDevice(collections.namedtuple('TorchDevice', 'index')):
    """Torch tensors as a device: on the CPU (``index`` None, ``'@torch'``)
    or on CUDA GPU ``index`` (``'@torch:cuda:N'``)."""

    __slots__ = ()

    def __str__(self):
        return '@torch' if self.index is None else \
            '@torch:cuda:{}'.format(self.index)


_ACCEPTED = ('use None, -1 or "@numpy" for the host, an int GPU id or '
             '"@cupy:N" for a GPU, or \'@torch\' (or \'@torch:cpu\') for '
             'torch CPU tensors and \'@torch:cuda:N\' for torch CUDA tensors')


def _parse_torch(device):
    if device in ('@torch', '@torch:cpu'):
        return TorchDevice(None)
    if device.startswith('@torch:cuda:'):
        number = device[len('@torch:cuda:'):]
        if number.isdigit():
            return TorchDevice(int(number))
    hint = ''
    if device == '@torch:cuda':
        hint = ' (name the GPU: \'@torch:cuda:0\' is the first)'
    raise ValueError('device {!r} is not understood{}; {}'.format(
        device, hint, _ACCEPTED))


def parse_device(device):
    """Return None for the host, the int id of a GPU, or a ``TorchDevice``.

    Accepted: ``None``, ``-1``, ``'@numpy'`` and ``'@cupy:N'``, an int
    ``N >= 0``, a cupy ``Device``, ``'@torch'`` (also ``'@torch:cpu'``)
    and ``'@torch:cuda:N'``.
    """
    if device is None or isinstance(device, TorchDevice):
        return device
    if isinstance(device, (bool, numpy.bool_)):
        raise TypeError('device must not be a bool, got {!r}'.format(device))
    if isinstance(device, (int, numpy.integer)):
        if device < -1:
            raise ValueError(
                'device {} is invalid: use -1 (or None) for the host or a GPU '
                'id >= 0'.format(device))
        return None if device == -1 else int(device)
    if isinstance(device, str):
        if device == '@numpy':
            return None
        if device.startswith('@cupy:'):
            number = device[len('@cupy:'):]
            if number.isdigit():
                return int(number)
        if device.startswith('@torch'):
            return _parse_torch(device)
        raise ValueError('device {!r} is not understood; {}'.format(
            device, _ACCEPTED))
    device_id = getattr(device, 'id', None)
    if type(device).__name__ == 'Device' and isinstance(device_id, int):
        return device_id
    raise TypeError(
        'device {!r} of type {} is not understood; use None, -1 or "@numpy" '
        'for the host, an int GPU id, "@cupy:N" or a cupy Device for a '
        'GPU, or \'@torch\' or \'@torch:cuda:N\' for torch '
        'tensors'.format(device, type(device).__name__))
