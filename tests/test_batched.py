"""Datasets with a batch method (``get_examples(indices)``, PyTorch's
``__getitems__``): every iterator calls it once per chunk, and the batches
are those of ``dataset[i]``, byte for byte."""

import functools
import re
import sys
import warnings

import numpy
import pytest

import chainiter
from chainiter import (
    MultiprocessIterator,
    MultithreadIterator,
    SerialIterator,
    concat_examples,
)
from chainiter.datasets import (
    DictDataset,
    SubDataset,
    TransformDataset,
    TupleDataset,
    split_dataset_random,
)

from helpers import (
    assert_resume_equivalent,
    fingerprint,
    shm_files,
    wait_processes_gone,
    worker_pids,
)


# ---- datasets (module level: the workers of every start method load them)

class PerExample:
    """The same examples as ``dataset``, through ``dataset[i]`` alone."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return self.dataset[i]


class TorchStyle:
    """PyTorch's protocol: ``__getitems__(indices)`` returns the list of
    examples; here example i is (float32 row, int label)."""

    def __init__(self, n):
        self.x = numpy.arange(n * 3, dtype=numpy.float32).reshape(n, 3)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i % 4

    def __getitems__(self, indices):
        rows = self.x[indices]
        return [(row, i % 4) for row, i in zip(rows, indices)]


class TorchStyleOff(TorchStyle):
    """``__getitems__ = None``: PyTorch's way of having none."""
    __getitems__ = None


class CallSizes:
    """Example i is (i, how many indices the call that loaded it had):
    ``get_examples`` gives the size of its chunk, ``dataset[i]`` 0."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, 0

    def get_examples(self, indices):
        return [(i, len(indices)) for i in indices]


class Augmented:
    """Example i is (i, row i + noise from example_rng()); with
    ``batched`` the batch method draws the same noise from
    ``example_rngs()``."""

    def __init__(self, n):
        self.base = numpy.arange(n * 3, dtype=numpy.float32).reshape(n, 3)

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        noise = chainiter.example_rng().normal(size=3)
        return i, (self.base[i] + noise).astype(numpy.float32)


class BatchAugmented(Augmented):
    """Loads through its batch method alone."""

    def __getitem__(self, i):
        raise AssertionError('dataset[{}] was called: the batch method '
                             'should have been'.format(i))

    def get_examples(self, indices):
        rngs = chainiter.example_rngs()
        assert len(rngs) == len(indices)
        return [(i, (self.base[i] + rng.normal(size=3)).astype(
            numpy.float32)) for i, rng in zip(indices, rngs)]


class AsksForOneGenerator(Augmented):
    """A batch method that (wrongly) calls example_rng()."""

    def get_examples(self, indices):
        chainiter.example_rng()
        return [self[i] for i in indices]


class FailsAt:
    """The batch method raises when its chunk holds ``bad``."""

    def __init__(self, n, bad):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return numpy.full(2, i)

    def get_examples(self, indices):
        if self.bad in indices:
            raise KeyError('no example {}'.format(self.bad))
        return [self[i] for i in indices]


class WrongCount(FailsAt):
    """The batch method returns ``delta`` examples too many (or too few)
    for the chunk holding ``bad``."""

    def __init__(self, n, bad, delta):
        super().__init__(n, bad)
        self.delta = delta

    def get_examples(self, indices):
        examples = [self[i] for i in indices]
        if self.bad in indices:
            if self.delta < 0:
                return examples[:self.delta]
            return examples + examples[:self.delta]
        return examples


class Noisy:
    """A dataset that draws from example_rng() (inside a TupleDataset it
    has no batch method)."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return chainiter.example_rng().integers(1000)


def count_examples(batch):
    """A converter other than concat_examples (applied in the parent)."""
    return len(batch), concat_examples(batch)


# ---- the batches equal those of dataset[i] ----

_RNG = numpy.random.default_rng(0)
_X = _RNG.random((23, 4), dtype=numpy.float32)
_LABELS = numpy.arange(23) % 5
_RNG_X30 = _RNG.random((30, 2))


def _datasets():
    """Datasets with a batch method, over 23 examples."""
    return {
        'tuple-arrays': TupleDataset(_X, _LABELS),
        'tuple-python-ints': TupleDataset(_X, [int(v) for v in _LABELS]),
        'tuple-1d-and-big-endian': TupleDataset(
            _X[:, 0], _X.astype('>f4'), _LABELS.astype(numpy.int16)),
        'tuple-strided': TupleDataset(_X[:, ::2], numpy.arange(23.0)),
        'dict': DictDataset(x=_X, label=[int(v) for v in _LABELS],
                            flag=_LABELS % 2 == 0),
        'torch-style': TorchStyle(23),
        'sub-random': split_dataset_random(TupleDataset(
            _RNG_X30, [int(v) for v in numpy.arange(30) % 3]), 23,
            seed=0)[0],
    }


DATASETS = sorted(_datasets())

CONVERTERS = {'list': None, 'stacked': concat_examples,
              'padded': functools.partial(concat_examples, padding=-1),
              'other': count_examples}


def _in_process(kind):
    return {'serial': SerialIterator,
            'thread1': functools.partial(MultithreadIterator, n_threads=1),
            'thread3': functools.partial(MultithreadIterator, n_threads=3),
            }[kind]


def _batches(iterator, converter, n):
    """``n`` batches as fingerprints; an in-process iterator's are
    converted here, as MultiprocessIterator converts its own."""
    out = []
    for _ in range(n):
        batch = next(iterator)
        if converter is not None and not isinstance(iterator,
                                                    MultiprocessIterator):
            batch = converter(batch)
        out.append(fingerprint(batch))
    return out


def _expected(dataset, converter, repeat, shuffle, n):
    with SerialIterator(PerExample(dataset), 5, repeat=repeat,
                        shuffle=shuffle, seed=7) as ref:
        return _batches(ref, converter, n)


@pytest.mark.parametrize('name', DATASETS)
@pytest.mark.parametrize('kind', ['serial', 'thread1', 'thread3'])
@pytest.mark.parametrize('repeat, shuffle', [(True, True), (False, False)])
def test_in_process_batches_equal_per_example_batches(name, kind, repeat,
                                                       shuffle):
    dataset = _datasets()[name]
    n = 12 if repeat else 5     # 23 examples, 5 a batch: batches that
    for converter in (None, concat_examples):   # span two epochs
        with _in_process(kind)(dataset, 5, repeat=repeat, shuffle=shuffle,
                               seed=7) as it:
            got = _batches(it, converter, n)
            if not repeat:
                with pytest.raises(StopIteration):
                    next(it)
        assert got == _expected(dataset, converter, repeat, shuffle, n)


# Every dataset stacked in the workers (the columns go straight into the
# slot), some as lists of examples, padded, or through another converter.
PAIRS = [(name, 'stacked') for name in DATASETS] + [
    ('tuple-arrays', 'list'), ('dict', 'list'), ('torch-style', 'list'),
    ('tuple-python-ints', 'padded'), ('tuple-1d-and-big-endian', 'padded'),
    ('tuple-strided', 'other'), ('dict', 'other')]


@pytest.mark.parametrize('name, converter', PAIRS, ids='-'.join)
def test_multiprocess_batches_equal_per_example_batches(method, name,
                                                        converter):
    dataset = _datasets()[name]
    convert = CONVERTERS[converter]
    with MultiprocessIterator(dataset, 5, n_processes=2, seed=7,
                              converter=convert, start_method=method) as it:
        got = _batches(it, convert, 12)
    assert got == _expected(dataset, convert, True, True, 12)


@pytest.mark.parametrize('name', ['tuple-arrays', 'dict'])
def test_columns_go_into_rows_with_room_to_spare(method, name):
    # shared_mem gives a field's rows more bytes than the column's: the
    # columns still go straight into the slot, packed, and read back.
    dataset = _datasets()[name]
    with MultiprocessIterator(dataset, 5, n_processes=2, seed=7,
                              shared_mem=4096, converter=concat_examples,
                              start_method=method) as it:
        got = _batches(it, concat_examples, 12)
        by_copy = it.stats['by_copy']
    assert got == _expected(dataset, concat_examples, True, True, 12)
    assert by_copy <= 1


@pytest.mark.parametrize('split', [True, False])
def test_multiprocess_batches_without_repeat_or_shuffle(method, split,
                                                        monkeypatch):
    # Split: 2 batches in flight for 3 workers (the fewest, 2 per CPU, on
    # a machine the iterator sees as 1 CPU, when the budget holds no
    # more), two chunks a batch.
    kwargs = {}
    if split:
        from chainiter.iterators.pipeline.processes import iterator
        monkeypatch.setattr(iterator, 'usable_cpus', lambda: 1)
        kwargs = dict(n_processes=3, prefetch_bytes=1)
    dataset = _datasets()['tuple-python-ints']
    with MultiprocessIterator(dataset, 5, repeat=False, shuffle=False,
                              n_processes=kwargs.pop('n_processes', 2),
                              converter=concat_examples,
                              start_method=method, **kwargs) as it:
        got = _batches(it, concat_examples, 5)
        if split:
            assert it.stats['prefetch'] == 2
        with pytest.raises(StopIteration):
            next(it)
    assert got == _expected(dataset, concat_examples, False, False, 5)


def test_a_snapshot_resumes_exactly_across_kinds_and_paths(method):
    dataset = _datasets()['dict']

    def mp(data, n_processes):
        return lambda: MultiprocessIterator(
            data, 5, n_processes=n_processes, seed=3,
            converter=concat_examples, start_method=method)
    # 23 examples, 5 a batch: step 4 spans two epochs.
    assert_resume_equivalent(mp(dataset, 2), [mp(PerExample(dataset), 1)],
                             6)
    assert_resume_equivalent(
        lambda: SerialIterator(dataset, 5, seed=3),
        [lambda: SerialIterator(PerExample(dataset), 5, seed=3),
         lambda: MultithreadIterator(dataset, 5, n_threads=3, seed=3)], 6)


# ---- it is called once per chunk ----

def test_the_batch_method_is_called_once_per_chunk(method):
    with SerialIterator(CallSizes(20), 4, shuffle=False) as it:
        assert next(it) == [(0, 4), (1, 4), (2, 4), (3, 4)]
    with MultithreadIterator(CallSizes(20), 5, shuffle=False,
                             n_threads=2) as it:
        # One call per thread, each on its part of the batch.
        assert next(it) == [(0, 2), (1, 2), (2, 3), (3, 3), (4, 3)]
    with MultiprocessIterator(CallSizes(20), 4, shuffle=False,
                              n_processes=1, start_method=method) as it:
        assert [next(it) for _ in range(3)] == [
            [(i, 4) for i in range(k, k + 4)] for k in (0, 4, 8)]


def test_torch_style_getitems_is_used_unless_none():
    with SerialIterator(TorchStyle(6), 3, shuffle=False) as it:
        batch = next(it)
    assert fingerprint(batch) == fingerprint(
        TorchStyle(6).__getitems__([0, 1, 2]))
    assert chainiter._context.batch_method(TorchStyle(6)) is not None
    assert chainiter._context.batch_method(TorchStyleOff(6)) is None
    with SerialIterator(TorchStyleOff(6), 3, shuffle=False) as it:
        assert fingerprint(next(it)) == fingerprint(batch)


# ---- TupleDataset and DictDataset ----

@pytest.mark.parametrize('name', [n for n in DATASETS if n != 'torch-style'])
def test_get_examples_equals_indexing_one_by_one(name):
    dataset = _datasets()[name]
    indices = [3, 0, 22, 3, -1, -23]
    examples = dataset.get_examples(indices)
    assert len(examples) == len(indices)
    expected = fingerprint([dataset[i] for i in indices])
    assert fingerprint(list(examples)) == expected
    assert fingerprint([examples[j] for j in range(6)]) == expected
    assert fingerprint(examples[1:4]) == fingerprint(
        [dataset[i] for i in indices[1:4]])
    with pytest.raises(IndexError):
        dataset.get_examples([0, 23])
    with pytest.raises(IndexError):
        dataset.get_examples([-24])


def test_get_examples_is_none_over_other_datasets():
    noisy = TupleDataset(Noisy(), numpy.arange(10))
    assert noisy.get_examples is None
    assert DictDataset(a=Noisy(), b=list(range(10))).get_examples is None
    assert SubDataset(noisy, 2, 6).get_examples is None
    assert TupleDataset(TransformDataset(_X, numpy.negative)
                        ).get_examples is None
    # So example_rng() in their examples works: the per-example path.
    with SerialIterator(noisy, 4, seed=1) as a, \
            SerialIterator(PerExample(noisy), 4, seed=1) as b:
        assert fingerprint(next(a)) == fingerprint(next(b))


# ---- example_rng() and example_rngs() ----

def test_example_rngs_make_the_batches_of_example_rng(method):
    def mp(dataset, n_processes=2):
        return lambda: MultiprocessIterator(
            dataset, 4, n_processes=n_processes, seed=5, start_method=method)
    expected = _expected_of(Augmented(11))
    for make in (lambda: SerialIterator(BatchAugmented(11), 4, seed=5),
                 lambda: MultithreadIterator(BatchAugmented(11), 4, seed=5,
                                             n_threads=3),
                 mp(BatchAugmented(11))):
        with make() as it:
            assert _batches(it, None, 8) == expected
    # Step 2 spans two epochs.
    assert_resume_equivalent(mp(BatchAugmented(11)), [mp(Augmented(11), 1)],
                             4)


def _expected_of(dataset):
    with SerialIterator(dataset, 4, seed=5) as ref:
        return _batches(ref, None, 8)


def test_example_rng_inside_a_batch_method_is_an_error(method):
    for make in (SerialIterator, functools.partial(
            MultiprocessIterator, n_processes=1, start_method=method)):
        with make(AsksForOneGenerator(8), 4) as it:
            with pytest.raises(RuntimeError, match='example_rngs()') as info:
                next(it)
            assert 'get_examples' in str(info.value)
            assert it.current_position == 0


def test_example_rngs_inside_dataset_getitem_is_one_generator():
    class One(Augmented):
        def __getitem__(self, i):
            rngs = chainiter.example_rngs()
            return i, rngs[0].normal(size=3).astype(numpy.float32), len(rngs)
    with SerialIterator(One(4), 2, seed=1) as it:
        assert [e[2] for e in next(it)] == [1, 1]
    with pytest.raises(RuntimeError, match='outside of an example load'):
        chainiter.example_rngs()


# ---- errors ----

def _notes(error):
    return ' '.join(getattr(error, '__notes__', []))


def test_an_error_in_the_batch_method_names_the_chunk(method):
    before = shm_files()
    with MultiprocessIterator(FailsAt(12, bad=5), 3, n_processes=2,
                              shuffle=False, start_method=method) as it:
        assert fingerprint(next(it)) == fingerprint(
            [numpy.full(2, i) for i in range(3)])
        pids = worker_pids()
        with pytest.raises(KeyError, match='no example 5') as info:
            next(it)
        assert 'Traceback' in str(info.value.__cause__)
        assert 'get_examples' in str(info.value.__cause__)
        if sys.version_info >= (3, 11):
            named = re.findall(r'examples \[([\d, ]+)\]', _notes(info.value))
            assert named, _notes(info.value)
            indices = [int(i) for i in named[0].split(',')]
            assert 5 in indices and set(indices) <= {3, 4, 5}
            assert 'dataset[3]' not in _notes(info.value)
        assert it.current_position == 3      # not advanced
        with pytest.raises(KeyError):
            next(it)                         # loaded again, fails again
    assert wait_processes_gone(pids, timeout=10)
    assert shm_files() <= before


def test_an_error_in_the_batch_method_in_process():
    with SerialIterator(FailsAt(12, bad=5), 3, shuffle=False) as it:
        next(it)
        with pytest.raises(KeyError) as info:
            next(it)
        if sys.version_info >= (3, 11):
            assert 'examples [3, 4, 5]' in _notes(info.value)
            assert 'epoch 0, positions 3..5' in _notes(info.value)
        assert it.current_position == 3


@pytest.mark.parametrize('delta', [-1, 1])
def test_a_wrong_number_of_examples_is_an_error(method, delta):
    message = 'returned {} examples for 3 indices'.format(3 + delta)
    for make in (SerialIterator,
                 functools.partial(MultithreadIterator, n_threads=1),
                 functools.partial(MultiprocessIterator, n_processes=1,
                                   start_method=method),
                 functools.partial(MultiprocessIterator, n_processes=1,
                                   converter=concat_examples,
                                   start_method=method)):
        with make(WrongCount(12, bad=4, delta=delta), 3,
                  shuffle=False) as it:
            next(it)
            with pytest.raises(ValueError, match=message):
                next(it)
            assert it.current_position == 3


# ---- stacking: what does not fit is stacked as concat_examples would ----

def test_columns_that_do_not_fit_the_layout_are_stacked_by_copy(method):
    # Python int labels, but one float and one bool; the first batch
    # measured int64.
    labels = list(range(24))
    labels[13], labels[14] = 2.5, True
    dataset = TupleDataset(_X[:1].repeat(24, axis=0) + numpy.arange(
        24, dtype=numpy.float32)[:, None], labels)
    with MultiprocessIterator(dataset, 4, n_processes=2, shuffle=False,
                              converter=concat_examples,
                              start_method=method) as it, \
            SerialIterator(PerExample(dataset), 4, shuffle=False) as ref, \
            warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        for _ in range(12):
            assert fingerprint(next(it)) == fingerprint(
                concat_examples(next(ref)))
    assert {w.category for w in record} <= {chainiter.SharedMemoryWarning}


def test_padded_fields_wider_than_the_arrays(method):
    # shared_mem widens the padded field beyond the arrays' rows.
    dataset = TupleDataset(numpy.arange(40, dtype=numpy.int32).reshape(
        10, 4), numpy.arange(10.0))
    converter = functools.partial(concat_examples, padding=0)
    with MultiprocessIterator(dataset, 3, n_processes=2, shared_mem=4096,
                              seed=2, converter=converter,
                              start_method=method) as it, \
            SerialIterator(PerExample(dataset), 3, seed=2) as ref:
        for _ in range(8):
            assert fingerprint(next(it)) == fingerprint(converter(next(ref)))


class _Sequences:
    """(int32 sequence of length 1..100, Python int label); the first
    batch's are short and the last example is the longest."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        n = 100 if i == 11 else i + 1
        return numpy.arange(n, dtype=numpy.int32), i % 3


def _sequences_warnings(method, shared_mem):
    """The warnings of six padded batches of ``_Sequences`` with
    ``shared_mem`` (each batch checked against SerialIterator's)."""
    converter = functools.partial(concat_examples, padding=0)
    with MultiprocessIterator(_Sequences(), 4, n_processes=2,
                              shared_mem=shared_mem, shuffle=False,
                              converter=converter,
                              start_method=method) as it, \
            SerialIterator(_Sequences(), 4, shuffle=False) as ref, \
            warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        for _ in range(6):
            assert fingerprint(next(it)) == fingerprint(converter(next(ref)))
    return [str(w.message) for w in record]


def test_shared_mem_counts_the_arrays_bytes_as_chainer_does(method):
    # shared_mem=400: room for 400 bytes of arrays an example (an int32
    # sequence of 100), the labels' rows on top, as Chainer's shared_mem
    # counts the arrays only.  A user who passed the bytes of the largest
    # example was told to pass more, and it came through a copy.
    assert _sequences_warnings(method, 400) == []


def test_an_example_too_large_for_shared_mem_is_named_in_its_bytes(method):
    # The warning counts as shared_mem does: the bytes of the example's
    # arrays (not rounded), against the room for arrays (not the labels').
    message, = _sequences_warnings(method, 200)
    assert 'an example with 400 bytes of arrays did not fit its shared ' \
        'memory (200 bytes of arrays per example)' in message
