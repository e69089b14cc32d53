"""The checks of constructor arguments, in one place so that they agree:
integers may be Python or numpy integers, never bools."""

import numpy


def positive_int(name, value, allow_none=False, hint=''):
    """``value`` as an int >= 1 (or None when ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, numpy.bool_)) or not isinstance(
            value, (int, numpy.integer)) or value <= 0:
        raise ValueError('{} must be a positive int{}, got {!r}{}'.format(
            name, ' or None' if allow_none else '', value, hint))
    return int(value)


def seconds(name, value):
    """A positive, finite number of seconds, or None."""
    if value is None:
        return None
    if isinstance(value, (bool, numpy.bool_)) or not isinstance(
            value, (int, float, numpy.integer, numpy.floating)) or \
            not 0 < value < float('inf'):
        raise ValueError(
            '{} must be a positive number of seconds, or None; got '
            '{!r}'.format(name, value))
    return float(value)


def callable_or_none(name, value):
    if value is not None and not callable(value):
        raise TypeError('{} must be callable, got {!r}'.format(name, value))
    return value
