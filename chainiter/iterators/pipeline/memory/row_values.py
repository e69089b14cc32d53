"""The values of a stacked slot's rows: the kind of value each row was
written from and the value given back for it (``kind_of``,
``restored``), the row ``concat_examples`` makes of a value
(``row_spec``, ``spec_bytes``) and the padding a dtype takes
(``pads``)."""

import math
import warnings

import numpy

# What a value was before it went into its row, for the parent to give the
# converter the same again when it stacks a batch itself (``restored``):
# concat_examples pads, and checks shapes, only when a field's first value
# is an array, and gives anything else to numpy.asarray, which promotes
# Python scalars and numpy ones alike but never casts them.
ARRAY = 'a'             # an ndarray (or a subclass: a memmap's row)
NUMPY_SCALAR = 's'      # numpy.int32(3), numpy.float64(0.5), ...
PYTHON_SCALAR = 'p'     # a bool, int, float or complex
OTHER = 'o'             # a list, a tuple, an int subclass...
PYTHON_SCALARS = frozenset((bool, int, float, complex))
_PYTHON_DTYPES = frozenset(numpy.dtype(t) for t in PYTHON_SCALARS)


def kind_of(value):
    """The kind (above) of a field's value."""
    kind = type(value)
    if kind is numpy.ndarray:
        return ARRAY
    if kind in PYTHON_SCALARS:
        return PYTHON_SCALAR
    if isinstance(value, numpy.generic):
        return NUMPY_SCALAR
    if isinstance(value, numpy.ndarray):
        return ARRAY
    return OTHER


def restored(row, kind):
    """The value of ``kind`` that ``row`` (a view of a row of the slot)
    was written from, or one ``concat_examples`` treats alike: an array
    as itself, a scalar as a scalar of its type, a list as a list: of
    Python numbers where numpy makes the row's dtype of those (as of
    ``[i, i + 1]``), else of the row's items (numpy scalars)."""
    if kind == ARRAY:
        return row
    if kind == PYTHON_SCALAR or (kind == OTHER and
                                 row.dtype in _PYTHON_DTYPES):
        return row.tolist()
    if kind == NUMPY_SCALAR or not row.shape:
        return row[()]
    return list(row)


def pads(padding, dtype):
    """Whether ``concat_examples`` can pad arrays of ``dtype`` (a str)
    with ``padding`` (None: it does not pad): ``numpy.full`` refuses -1
    for uint8, for one.  A field without padding in the layout (its first
    batch had lists, or 0-d arrays) may get arrays of any dtype."""
    if padding is None:
        return True
    try:
        return _PADS[padding, dtype]
    except KeyError:
        pass
    except TypeError:       # unhashable
        return _pads(padding, dtype)
    if len(_PADS) > 64:
        _PADS.clear()
    fits = _PADS[padding, dtype] = _pads(padding, dtype)
    return fits


_PADS = {}


def _pads(padding, dtype):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            numpy.full((), padding, dtype=dtype)
    except Exception:
        return False
    return True


def row_spec(value):
    """``(dtype, shape)`` of the row ``concat_examples`` makes of
    ``value`` (a field of one example), or None when that is not a numeric
    array."""
    if type(value) is numpy.ndarray:
        dtype, shape = native_dtype(value.dtype), value.shape
    else:
        try:
            array = numpy.asarray([value])
        except Exception:
            return None
        dtype, shape = array.dtype, array.shape[1:]
    if dtype.kind not in 'biufc':
        return None
    return dtype, shape


def spec_bytes(spec):
    """Bytes of a row of ``spec``: ``(dtype, shape)``, or a field's
    ``(dtype str, shape, kind)`` in ``Rows.specs``."""
    # math.prod, not numpy.prod: called for every field of every example
    # a worker writes, where numpy's took 4 us (bucketed examples were
    # 4x slower in a worker than in a plain loop).
    return math.prod(spec[1]) * numpy.dtype(spec[0]).itemsize


def native_dtype(dtype):
    return dtype.newbyteorder('=') if dtype.byteorder in '<>' else dtype
