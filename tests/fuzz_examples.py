"""Random datasets for the fuzz tests: each seed draws a structure (a tuple,
a dict, a bare value) and, per field, a kind of value (arrays of any numpy
kind and byte order, of one shape or ragged, 0-d arrays, numpy scalars,
Python values), some fields changing kind, shape or dtype mid-epoch.
Example ``i`` is a pure function of ``(seed, i)``, so the dataset pickles
small and every process draws the same examples.

``same(a, b)`` compares two batches element by element: type, dtype (byte
order included), shape and bytes of every array, type and value of every
other value, and a dict's key order."""

import numpy

# Every kind numpy stacks and pads: bool, signed and unsigned integers,
# floats, complex numbers, bytes, text, dates and durations.
DTYPES = ('?', 'i1', 'i2', 'i4', 'i8', 'u1', 'u2', 'u4', 'u8', 'f2', 'f4',
          'f8', 'c8', 'c16', 'S3', 'U2', 'M8[s]', 'm8[ms]')
PYTHON_VALUES = ('none', 'int', 'float', 'bool', 'complex', 'str', 'bytes',
                 'list', 'tuple')
# The kinds of a field: its values' kind in the first part of the epoch
# and, for the changing ones, in the rest.
FIELD_KINDS = ('array', 'array', 'array', 'ragged', 'ragged-nd', 'zero-d',
               'numpy-scalar', 'python', 'python', 'sometimes-none',
               'array-or-python', 'ragged-or-python', 'ragged-nd-or-python',
               'changes-shape', 'changes-dtype', 'changes-kind')


class FuzzDataset:
    """``n`` examples drawn from ``seed`` (see the module docstring)."""

    def __init__(self, seed, n=48):
        self.seed = seed
        self.n = n
        rng = numpy.random.default_rng([seed, 0])
        self.structure = rng.choice(['tuple', 'tuple', 'dict', 'bare'])
        n_fields = 1 if self.structure == 'bare' else int(rng.integers(1, 4))
        self.fields = [_field(rng) for _ in range(n_fields)]
        # Dicts whose key order varies: from the start, or only late.
        self.shuffled_keys = self.structure == 'dict' and str(
            rng.choice(['never', 'never', 'always', 'late']))
        self.change_at = int(rng.integers(1, n))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = numpy.random.default_rng([self.seed, 1, i])
        late = i >= self.change_at
        values = [_value(field, rng, late) for field in self.fields]
        if self.structure == 'bare':
            return values[0]
        if self.structure == 'tuple':
            return tuple(values)
        keys = ['f%d' % k for k in range(len(values))]
        pairs = list(zip(keys, values))
        if i % 2 and (self.shuffled_keys == 'always' or
                      self.shuffled_keys == 'late' and late):
            pairs.reverse()
        return dict(pairs)

    def describe(self):
        return '%s %r%s, changing at %d' % (
            self.structure, self.fields,
            ', keys reordered %s' % self.shuffled_keys
            if self.structure == 'dict' else '', self.change_at)


def _field(rng):
    kind = str(rng.choice(FIELD_KINDS))
    dtype = str(rng.choice(DTYPES))
    if dtype[0] not in 'SUMm' and rng.random() < 0.3:
        # The other byte order (numpy's pickle drops it from datetime64
        # and timedelta64 arrays: not drawn for them).
        dtype = '>' + dtype
    other = str(rng.choice(DTYPES))
    shape = tuple(int(d) for d in rng.integers(1, 4, int(rng.integers(1, 3))))
    python = str(rng.choice(PYTHON_VALUES))
    return kind, dtype, other, shape, python


def _array(dtype, shape, rng):
    dtype = numpy.dtype(dtype)
    size = int(numpy.prod(shape, dtype=numpy.int64))
    if dtype.kind in 'SU':
        letters = numpy.array(list('abcdefg'))
        values = [''.join(rng.choice(letters, int(rng.integers(0, 3))))
                  for _ in range(size)]
        out = numpy.array(values, dtype=dtype.str[1:] if dtype.kind == 'U'
                          else 'U%d' % dtype.itemsize).astype(dtype)
    elif dtype.kind == '?':
        out = rng.random(size) < 0.5
    elif dtype.kind in 'iu':
        info = numpy.iinfo(dtype)
        out = rng.integers(info.min, info.max, size, dtype=dtype.newbyteorder(
            '='), endpoint=True)
    elif dtype.kind in 'Mm':
        out = rng.integers(-10 ** 6, 10 ** 6, size).astype(dtype)
    elif dtype.kind == 'c':
        out = rng.standard_normal(size) + 1j * rng.standard_normal(size)
    else:
        out = rng.standard_normal(size) * 100
    return numpy.asarray(out).astype(dtype).reshape(shape)


def _python(kind, rng):
    x = int(rng.integers(-1000, 1000))
    return {
        'none': None, 'int': x, 'float': x / 8, 'bool': x % 2 == 0,
        'complex': complex(x, 1), 'str': 'v%d' % x, 'bytes': b'%d' % x,
        'list': [x, x + 1], 'tuple': (x, 'x'),
    }[kind]


def _value(field, rng, late):
    kind, dtype, other, shape, python = field
    if kind == 'array':
        return _array(dtype, shape, rng)
    if kind.endswith('-or-python') and rng.random() < 0.15:
        return _python(python, rng)
    if kind.startswith('ragged-nd'):
        return _array(dtype, tuple(int(d) for d in rng.integers(1, 4, 2)),
                      rng)
    if kind.startswith('ragged'):
        return _array(dtype, (int(rng.integers(0, 5)),), rng)
    if kind == 'zero-d':
        return _array(dtype, (), rng)
    if kind == 'numpy-scalar':
        return _array(dtype, (), rng)[()]
    if kind == 'python':
        return _python(python, rng)
    if kind == 'sometimes-none':
        return None if rng.random() < 0.2 else _array(dtype, shape, rng)
    if kind == 'array-or-python':
        return _array(dtype, shape, rng)
    if kind == 'changes-shape':
        return _array(dtype, shape + (2,) if late else shape, rng)
    if kind == 'changes-dtype':
        return _array(other if late else dtype, shape, rng)
    # changes-kind: arrays, then Python values
    return _python(python, rng) if late else _array(dtype, shape, rng)


def same(a, b):
    """Whether ``a`` and ``b`` are alike element by element (see the module
    docstring)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, numpy.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.hasobject:
            return same(a.tolist(), b.tolist())
        return a.tobytes() == b.tobytes()
    if isinstance(a, numpy.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def difference(a, b, where='batch'):
    """Where ``a`` and ``b`` first differ, in words (for a failing test)."""
    if type(a) is not type(b):
        return '%s: %s against %s' % (where, type(a).__name__,
                                      type(b).__name__)
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return '%s: %d values against %d' % (where, len(a), len(b))
        for k, (x, y) in enumerate(zip(a, b)):
            if not same(x, y):
                return difference(x, y, '%s[%d]' % (where, k))
    if isinstance(a, dict):
        if list(a) != list(b):
            return '%s: keys %s against %s' % (where, list(a), list(b))
        for k in a:
            if not same(a[k], b[k]):
                return difference(a[k], b[k], '%s[%r]' % (where, k))
    return '%s: %r against %r' % (where, a, b)
