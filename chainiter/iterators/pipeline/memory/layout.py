"""Where the arrays of a batch go in a shared-memory slot: the types.

``list_layout.py`` and ``stacked_layout.py`` build and fill the two
layouts, ``stacked_rows.py`` and ``example_rows.py`` write stacked rows,
``stacked_read.py`` reads them back (``exact_rows.py``: list batches'
examples), and ``read.py`` reads a whole batch back.

Two layouts, both measured from the first batch:

- ``list``: every example gets a region of ``example_bytes``; the arrays of
  its top-level fields are written one after another (64-byte aligned) and
  the worker sends back the example with each array replaced by a
  ``ShmRef(offset, nbytes, shape, dtype)``.  The parent hands out views.
- ``stacked`` (``converter=concat_examples``): every field of the batch is
  one array in the slot, ``row_bytes`` per example; worker ``w`` writes
  example ``j`` straight into row ``j`` (padding included), so the parent
  hands out ``concat_examples``' result without copying.  A padded field's
  rows have the field's dtype and ``capacity``; the rows of a field without
  padding have the dtype and shape of the batch's examples (any that fit
  ``row_bytes``: bucketed data changes them from batch to batch), which
  the worker reports in ``Rows.specs``.

An example that does not fit (too large, another structure, or unlike the
examples before it in its chunk) is sent back whole through the pipe
instead; the parent then builds that batch the ordinary way, so nothing is
ever truncated, and the buffers grow to fit it.
"""

import typing

import numpy

_ALIGN = 64


def align(n):
    return -(-n // _ALIGN) * _ALIGN


class ShmRef(typing.NamedTuple):
    """An array that was written into shared memory."""
    offset: int
    nbytes: int
    shape: tuple
    dtype: numpy.dtype


class Whole(typing.NamedTuple):
    """An example sent through the pipe: it has no slot or did not fit."""
    example: object


class Field(typing.NamedTuple):
    key: object          # tuple position, dict key, or None for bare examples
    dtype: str           # padded: the rows'; else: the last batch measured
    capacity: tuple      # padded: largest shape a row holds; else: as dtype
    offset: int          # where the field's rows start in a slot
    row_bytes: int       # bytes per example


class Layout(typing.NamedTuple):
    mode: str                    # 'list' or 'stacked'
    slot_bytes: int
    example_bytes: int = 0       # list mode
    structure: str = ''          # stacked mode: 'tuple', 'dict' or 'single'
    fields: tuple = ()           # stacked mode
    padding: object = None       # stacked mode: the value, tuple or dict
    padded: tuple = ()           # stacked mode: indices of padded fields
    # Stacked mode, for batches handed out as lists (no converter): every
    # example must come back as it was loaded, its types and all, so that
    # only those of tuples, dicts, arrays of native byte order, numpy
    # scalars and Python bools, ints, floats and complex numbers go into
    # rows (``exact_rows.exact_columns``); any other comes whole.
    exact: bool = False

