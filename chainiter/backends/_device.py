"""Parsing of Chainer's device specifiers."""

import numpy


def parse_device(device):
    """Return None for the host or the int id of a GPU.

    Accepted: ``None``, ``-1``, ``'@numpy'`` and ``'@cupy:N'``, an int
    ``N >= 0``, and a cupy ``Device``.
    """
    if device is None:
        return None
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
        raise ValueError(
            'device {!r} is not understood; use None, -1 or "@numpy" for the '
            'host, or an int GPU id or "@cupy:N" for a GPU'.format(device))
    device_id = getattr(device, 'id', None)
    if type(device).__name__ == 'Device' and isinstance(device_id, int):
        return device_id
    raise TypeError(
        'device {!r} of type {} is not understood; use None, -1 or "@numpy" '
        'for the host, or an int GPU id, "@cupy:N" or a cupy Device for a '
        'GPU'.format(device, type(device).__name__))
