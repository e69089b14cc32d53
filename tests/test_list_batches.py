"""List batches (no converter, as Chainer's iterators hand out): the
workers still stack the examples in shared memory, and ``next()`` returns
the list of the examples made of views of the rows, each value of the
type it was loaded as.  ``concat_examples`` of that list returns the
stacked arrays without a copy.  The list is the SerialIterator's list in
every way a user sees."""

import collections
import copy
import enum
import pickle
import warnings

import numpy
import pytest

from chainiter import (
    DevicePrefetcher, MultiprocessIterator, MultithreadIterator,
    SerialIterator, concat_examples, to_device)
from chainiter.dataset.stacked_examples import StackedExamples

from helpers import fingerprint

Pair = collections.namedtuple('Pair', 'x y')


class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


class Kinds:
    """Example i of one kind of structure and values."""

    def __init__(self, kind, n=160):
        self.kind = kind
        self.n = n
        self.x = numpy.arange(n * 3, dtype=numpy.float32).reshape(n, 3)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        kind, x = self.kind, self.x[i]
        if kind == 'tuple':
            return x.copy(), i % 7
        if kind == 'dict':
            return {'x': x.copy(), 'y': numpy.int32(i), 'z': i * 0.5}
        if kind == 'array':
            return x.copy()
        if kind == 'int':
            return i
        if kind == 'scalars':
            return (numpy.float32(i), i % 2 == 0, complex(i, 1),
                    numpy.array(i, dtype=numpy.int16))
        if kind == 'namedtuple':
            return Pair(x.copy(), i)
        if kind == 'nested':
            return x.copy(), (i, i + 1)
        if kind == 'list-field':
            return x.copy(), [i, i + 1]
        if kind == 'enum':
            return x.copy(), Color(1 + i % 2)
        if kind == 'big-endian':
            return x.astype('>f4'), i
        if kind == 'mixed':
            # A float among the ints: each comes back as it was.
            return x.copy(), (i if i % 5 else i + 0.5)
        if kind == 'ragged':
            return numpy.arange(1 + i % 7, dtype=numpy.int32), i
        if kind == 'ragged-2d':
            return {'x': numpy.full((1 + i % 3, 1 + i % 4), i,
                                    dtype=numpy.float32), 'y': x.copy()}
        if kind == 'ragged-single':
            return numpy.arange(1 + i % 5, dtype=numpy.int64) * i
        if kind == 'strings':
            return x.copy(), 'example {}'.format(i)
        # A field that is an array in some examples and a Python value in
        # others: each example comes back as it was.
        if kind == 'label-or-none':
            return x.copy(), None if i % 11 == 3 else i
        if kind == 'int-or-0d':
            return x.copy(), numpy.array(i) if i % 3 else i
        if kind == 'array-or-values':
            return (x.copy() if i % 13 else [i, 'x']), numpy.float32(i)
        if kind == 'ragged-2d-or-none':
            return numpy.full((1 + i % 3, 1 + i % 4), i,
                              dtype=numpy.float32) if i % 17 != 5 else \
                None, i
        if kind == 'key-order':
            # Dicts of the same keys in two orders, each kept.
            pairs = [('x', x.copy()), ('y', i)]
            return dict(pairs[::-1] if i % 4 == 1 else pairs)
        raise ValueError(kind)


KINDS = ['tuple', 'dict', 'array', 'int', 'scalars', 'namedtuple', 'nested',
         'list-field', 'enum', 'big-endian', 'mixed', 'strings', 'ragged',
         'ragged-2d', 'ragged-single', 'label-or-none', 'int-or-0d',
         'array-or-values', 'ragged-2d-or-none', 'key-order']


@pytest.fixture(autouse=True)
def group_early(monkeypatch):
    """Group after two batches, in groups of at most four."""
    for kind in (MultiprocessIterator, MultithreadIterator):
        monkeypatch.setattr(kind, 'GROUP_AFTER', 2)
        monkeypatch.setattr(kind, 'GROUP_S', 10.0)
        monkeypatch.setattr(kind, 'MAX_GROUP', 4)


def _serial(dataset, n, **kwargs):
    with SerialIterator(dataset, 5, shuffle=True, seed=3, **kwargs) as it:
        return [fingerprint(next(it)) for _ in range(n)]


@pytest.mark.parametrize('kind', KINDS)
def test_list_batches_are_the_serial_ones(method, kind):
    dataset = Kinds(kind)
    expected = _serial(dataset, 30)
    with MultiprocessIterator(dataset, 5, n_processes=2, shuffle=True,
                              seed=3, start_method=method) as it:
        got = [fingerprint(list(next(it))) for _ in range(30)]
    assert got == expected


@pytest.mark.parametrize('n_threads', [1, 2])
@pytest.mark.parametrize('kind', KINDS)
def test_thread_list_batches_are_the_serial_ones(n_threads, kind):
    dataset = Kinds(kind)
    expected = _serial(dataset, 30)
    with MultithreadIterator(dataset, 5, n_threads=n_threads, shuffle=True,
                             seed=3) as it:
        got = [fingerprint(list(next(it))) for _ in range(30)]
    assert got == expected


@pytest.mark.parametrize('arguments', [
    {}, {'n_prefetch': 8, 'shared_mem': 64, 'maxtasksperchild': 4}],
    ids=['defaults', 'all'])
def test_list_batches_are_stacked_by_the_workers(method, arguments):
    dataset = Kinds('tuple')
    expected = _serial(dataset, 40)
    with MultiprocessIterator(dataset, 5, n_processes=2, shuffle=True,
                              seed=3, start_method=method,
                              **arguments) as it:
        got, groups = [], []
        for i in range(40):
            batch = next(it)
            # (The first batch comes by copy: it sizes the buffers.)
            assert i == 0 or type(batch) is StackedExamples
            got.append(fingerprint(list(batch)))
            groups.append(it.stats['batches_per_task'])
        assert it.stats['by_copy'] == 1      # the first batch only
    assert got == expected
    assert max(groups) > 1


@pytest.mark.parametrize('kind', ['tuple', 'dict', 'array', 'scalars'])
def test_concat_examples_of_a_list_batch_is_the_stacked_rows(kind):
    dataset = Kinds(kind)
    with MultiprocessIterator(dataset, 5, n_processes=2, shuffle=False,
                              start_method='fork') as it:
        for i in range(12):
            batch = next(it)
            stacked = concat_examples(batch)
            assert fingerprint(stacked) == \
                fingerprint(concat_examples(list(batch)))
            first = stacked[0] if kind in ('tuple', 'scalars') else \
                stacked['x'] if kind == 'dict' else stacked
            example = batch[0]
            value = example[0] if kind in ('tuple', 'scalars') else \
                example['x'] if kind == 'dict' else example
            if kind != 'scalars' and i > 0:
                # No copy: the example views the stacked rows (the first
                # batch comes by copy, to size the buffers).
                assert numpy.shares_memory(first, value)


def test_a_list_batch_held_pickled_and_copied_stays_as_it_was(method):
    dataset = Kinds('dict')
    with SerialIterator(dataset, 5, shuffle=False) as ref:
        expected = [fingerprint(next(ref)) for _ in range(40)]
    with MultiprocessIterator(dataset, 5, n_processes=2, shuffle=False,
                              start_method=method) as it:
        held = [next(it) for _ in range(40)]
        more = [next(it) for _ in range(40)]     # the slots go round
        assert [fingerprint(list(b)) for b in held] == expected
        for batch, want in zip(held, expected):
            for other in (pickle.loads(pickle.dumps(batch)),
                          copy.copy(batch), copy.deepcopy(batch)):
                assert type(other) is list
                assert fingerprint(other) == want
            assert len(batch) == 5
            assert fingerprint(batch[1:3]) == fingerprint(list(batch)[1:3])
        del more


def test_a_list_batch_rebuilt_by_its_type_is_a_list_of_the_items():
    """Tree maps (Lightning's apply_to_collection moving a batch to the
    device, ``keras.tree``) rebuild a sequence as ``type(seq)(items)``."""
    dataset = Kinds('dict')
    with MultiprocessIterator(dataset, 5, n_processes=1, shuffle=False,
                              start_method='fork') as it:
        batch = next(it)
        doubled = type(batch)(
            {key: value * 2 for key, value in example.items()}
            for example in batch)
        assert fingerprint(concat_examples(doubled)) == fingerprint(
            concat_examples([{key: value * 2 for key, value in e.items()}
                             for e in list(batch)]))
        assert len(doubled) == 5
        assert type(batch)() == []


def test_a_changed_list_batch_converts_as_changed():
    dataset = Kinds('dict')
    with MultiprocessIterator(dataset, 5, n_processes=2, shuffle=False,
                              start_method='fork') as it:
        for _ in range(8):
            next(it)
        batch = next(it)
        batch[0] = dataset[100]
        assert fingerprint(concat_examples(batch)) == \
            fingerprint(concat_examples(list(batch)))
        batch = next(it)
        batch[1]['y'] = numpy.int32(-1)          # a dict example changed
        assert concat_examples(batch)['y'][1] == -1
        batch = next(it)
        batch.append(dataset[0])
        assert len(concat_examples(batch)['x']) == 6
        batch = next(it)
        batch[2]['x'][0] = -5.0                  # inside the array: a view
        assert concat_examples(batch)['x'][2, 0] == -5.0


@pytest.mark.parametrize('kind', ['ragged', 'ragged-2d', 'ragged-single'])
def test_ragged_list_batches_pad_in_the_workers(method, kind):
    # Arrays of several shapes are padded with 0 in their rows; each
    # example is its row cut to its shape, and concat_examples with
    # padding=0 is the padded rows, without a copy; any other padding
    # pads the examples as they are.
    dataset = Kinds(kind)
    with SerialIterator(dataset, 5, shuffle=True, seed=3) as ref:
        expected = [list(next(ref)) for _ in range(40)]
    with MultiprocessIterator(dataset, 5, n_processes=2, shuffle=True,
                              seed=3, start_method=method) as it:
        got = [next(it) for _ in range(40)]
        # The first batch, and those with longer examples than any before
        # (they grow the buffers), come by copy.
        by_copy = it.stats['by_copy']
    assert by_copy < 10
    assert sum(type(b) is StackedExamples for b in got) == 40 - by_copy
    for batch, want in zip(got, expected):
        assert fingerprint(list(batch)) == fingerprint(want)
        for padding in (0, -1):
            assert fingerprint(concat_examples(batch, padding=padding)) == \
                fingerprint(concat_examples(want, padding=padding))
        if type(batch) is StackedExamples:
            assert batch.stacked_for(0) is not None
            assert batch.stacked_for(-1) is None


class _Buckets:
    """Sequences of length 1, 2, 3 or 4 (x 3 values) by runs of five
    examples: with ``_Blocks`` each batch of five is one bucket."""

    def __len__(self):
        return 200

    def __getitem__(self, i):
        return numpy.full((1 + (i // 5) % 4, 3), i, numpy.float32), i % 3


class _Blocks:
    """An order of whole runs of five, shuffled."""

    def __init__(self, seed):
        self.rng = numpy.random.default_rng(seed)

    def __call__(self, current_order, current_position):
        return (self.rng.permutation(40)[:, None] * 5 +
                numpy.arange(5)).reshape(-1)


def test_bucketed_list_batches_stay_unpadded_after_a_mixed_group(method):
    # A group of batches of several buckets does not stack as one array:
    # the groups go on in parts, as with concat_examples, each batch read
    # as its own; each batch is of one shape, so its rows need no padding
    # and concat_examples of it is the workers' rows.  (The group's mixed
    # shapes made the rows padded to the largest of every dimension from
    # then on: each example written alone, and concat_examples stacking
    # the batch anew.)
    with SerialIterator(_Buckets(), 5, order_sampler=_Blocks(0)) as ref:
        expected = [list(next(ref)) for _ in range(240)]
    got, stacked, grouped = [], [], []
    with MultiprocessIterator(_Buckets(), 5, n_processes=2,
                              order_sampler=_Blocks(0),
                              start_method=method) as it:
        for _ in range(240):
            batch = next(it)    # (held batches would hold their slots)
            got.append(fingerprint(list(batch)))
            stacked.append(type(batch) is StackedExamples and
                           concat_examples(batch)[0] is batch.stacked[0])
            grouped.append(it.stats['batches_per_task'])
    assert got == [fingerprint(b) for b in expected]
    assert grouped[-1] > 1      # still grouped
    # Once the groups in flight have come, the workers' rows.
    assert all(stacked[-60:])


class _TurnsRagged:
    """Arrays of shape (4, 3) in the first four batches of five, of
    shapes (1..4, 3) after."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        rows = 4 if i < 20 else 1 + i % 4
        return numpy.full((rows, 3), i, numpy.float32), i


def test_list_batches_that_turn_ragged_warn_of_nothing(method):
    # The first ragged batch comes by copy and the rows are padded from
    # then on: no example was too large, so no SharedMemoryWarning (it
    # said that an example of 12 bytes 'did not fit' rows of 48).
    with SerialIterator(_TurnsRagged(), 5, shuffle=False) as ref:
        expected = [fingerprint(next(ref)) for _ in range(8)]
    with MultiprocessIterator(_TurnsRagged(), 5, n_processes=2,
                              shuffle=False, start_method=method) as it, \
            warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        got = [fingerprint(list(next(it))) for _ in range(8)]
    assert got == expected
    assert [str(w.message) for w in record] == []


def test_list_batches_go_to_a_device_as_lists(method):
    """``to_device``, ``concat_examples(device=...)`` and a
    ``DevicePrefetcher`` take a list batch as they take a list."""
    dataset = Kinds('tuple')
    with MultiprocessIterator(dataset, 5, n_processes=2, shuffle=False,
                              start_method=method) as it:
        for i in range(6):
            batch = next(it)
            as_list = list(batch)
            for device in (-1, '@numpy'):
                sent = to_device(device, batch)
                assert type(sent) is list
                assert fingerprint(sent) == fingerprint(as_list)
                assert fingerprint(concat_examples(batch, device)) == \
                    fingerprint(concat_examples(as_list, device))
        assert type(batch) is StackedExamples   # the case in question
    with MultiprocessIterator(dataset, 5, n_processes=2, shuffle=False,
                              start_method=method) as it, \
            SerialIterator(dataset, 5, shuffle=False) as serial, \
            DevicePrefetcher(it, -1, converter=list) as prefetcher:
        for i in range(6):
            assert fingerprint(next(prefetcher)) == \
                fingerprint(next(serial))
