"""The built-in workloads: datasets, batch sizes and converters.

Every dataset is defined at module level so that worker processes of any
start method can load it.
"""

import functools
import importlib

import numpy

from chainiter.dataset.convert import concat_examples
from chainiter.datasets import TupleDataset


class Images:
    """(float32 3x224x224 image, int label); each example is a fresh copy
    of one of a few preloaded images."""

    def __init__(self, n=50000, n_distinct=8):
        rng = numpy.random.default_rng(0)
        self.images = rng.random((n_distinct, 3, 224, 224),
                                 dtype=numpy.float32)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.images[i % len(self.images)].copy(), i % 1000


def _tiny_data(n):
    return numpy.random.default_rng(0).random((n, 16), dtype=numpy.float32)


class Tiny:
    """(float32 array of 16, int label)."""

    def __init__(self, n=1_000_000):
        self.data = _tiny_data(n)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i], i % 10


class TinyCopy(Tiny):
    """``tiny`` as users write it: (a fresh copy of a float32 array of 16,
    Python int label)."""

    def __getitem__(self, i):
        return self.data[i].copy(), int(i) % 10


def tiny_batched(n=1_000_000):
    """``tiny``'s examples as a ``TupleDataset`` of in-memory arrays, which
    has a batch method: the workers take each chunk a column at a time.
    The labels are an int64 array (``concat_examples`` makes the same of
    ``tiny``'s Python ints)."""
    return TupleDataset(_tiny_data(n), numpy.arange(n) % 10)


class ArrayBatches:
    """For DataLoader's batched path: ``dataset[indices]`` is the tuple of
    each array's rows at ``indices`` (one fancy index per array), with
    ``batch_size=None`` and a ``BatchSampler`` as the sampler."""

    def __init__(self, *arrays):
        self.arrays = arrays

    def __len__(self):
        return len(self.arrays[0])

    def __getitem__(self, indices):
        return tuple(numpy.take(a, indices, axis=0) for a in self.arrays)


def tiny_batches(n=1_000_000):
    return ArrayBatches(_tiny_data(n), numpy.arange(n) % 10)


class Cpu:
    """About 2 ms of numpy work per example; a float32 64x64 array."""

    ROUNDS = 40

    def __init__(self, n=100000):
        rng = numpy.random.default_rng(0)
        self.w = (rng.standard_normal((64, 64)) / 8).astype(numpy.float32)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = numpy.full((64, 64), (i % 97) / 97, dtype=numpy.float32)
        for _ in range(self.ROUNDS):
            x = numpy.tanh(x @ self.w + numpy.sin(x))
        return x


class Variable:
    """int32 sequences of length 10..2000, padded when batched."""

    def __init__(self, n=200000):
        self.lengths = numpy.random.default_rng(0).integers(10, 2001, n)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return numpy.arange(self.lengths[i], dtype=numpy.int32)


class VariableLabelled:
    """(int32 sequence of length 10..2000, Python int label), as users
    write it: each sequence a copy of a slice of one preallocated array
    (1, 2, ..., 2000), padded with 0 when batched. Its lengths are
    ``variable``'s."""

    def __init__(self, n=200000):
        self.lengths = numpy.random.default_rng(0).integers(10, 2001, n)
        self.data = numpy.arange(1, 2001, dtype=numpy.int32)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return self.data[:self.lengths[i]].copy(), int(i) % 10


class VariablePacked:
    """(int32 sequence of length 10..2000, Python int label): ``n``
    sequences (4096) of random lengths and values, packed back to back in
    one int32 array; example i is a copy of sequence i's slice of it,
    padded with 0 when batched.  Unlike ``variable-labelled`` (every
    example a prefix of one 2000-element array, which stays in the
    cache), the examples come from many places in memory (16 MB), as
    users' datasets do."""

    def __init__(self, n=4096):
        rng = numpy.random.default_rng(0)
        lengths = rng.integers(10, 2001, n)
        self.offsets = numpy.concatenate(([0], numpy.cumsum(lengths)))
        self.data = rng.integers(1, 2 ** 31 - 1, int(self.offsets[-1]),
                                 dtype=numpy.int32)

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        return (self.data[self.offsets[i]:self.offsets[i + 1]].copy(),
                int(i) % 10)


class Bucketed:
    """(float32 array of shape (L, 64), int label): bucketed sequences.
    Each run of ``block`` consecutive examples has one length L, of 16, 32,
    64 or 128 in turn; ``BlockOrder`` deals the runs out whole, in a random
    order, so that every batch is one bucket (stacked without padding,
    its shape changing from batch to batch)."""

    LENGTHS = (16, 32, 64, 128)

    def __init__(self, n=64000, block=64):
        self.n, self.block = n, block
        self.data = numpy.random.default_rng(0).random(
            (128, 64), dtype=numpy.float32)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        length = self.LENGTHS[(i // self.block) % len(self.LENGTHS)]
        return self.data[:length] + numpy.float32(i % 7), i % 10


class BlockOrder:
    """An order sampler (and DataLoader batch sampler) that shuffles whole
    runs of ``block`` consecutive indices: each batch of that size is one
    run."""

    def __init__(self, n, block, seed=0):
        self.n, self.block = n, block
        self.rng = numpy.random.default_rng(seed)

    def order(self):
        blocks = self.rng.permutation(self.n // self.block)
        return (blocks[:, None] * self.block +
                numpy.arange(self.block)).reshape(-1)

    def __call__(self, current_order, current_position):
        return self.order()

    def __iter__(self):         # as DataLoader's batch_sampler
        return iter(self.order().reshape(-1, self.block).tolist())

    def __len__(self):
        return self.n // self.block


def _pad_collate(batch):
    import torch
    return torch.nn.utils.rnn.pad_sequence(
        [torch.from_numpy(x) for x in batch], batch_first=True)


def _pad_label_collate(batch):
    import torch
    sequences, labels = zip(*batch)
    return (torch.nn.utils.rnn.pad_sequence(
        [torch.from_numpy(x) for x in sequences], batch_first=True),
        torch.tensor(labels))


class Workload:
    """``torch_batches``: a function making the same data for DataLoader's
    batched path (``ArrayBatches``), which it then takes instead of
    ``make()`` and its per-example path."""

    def __init__(self, name, make, batch_size, converter=concat_examples,
                 torch_collate=None, description='', order=None,
                 torch_batches=None):
        self.name = name
        self.make = make
        self.batch_size = batch_size
        self.converter = converter
        self.torch_collate = torch_collate
        self.description = description
        # order(dataset, batch_size): a BlockOrder, or None to shuffle
        self.order = order
        self.torch_batches = torch_batches


WORKLOADS = {
    'images': Workload('images', Images, 64,
                       description='float32 3x224x224 + label, batch 64'),
    'tiny': Workload('tiny', Tiny, 256,
                     description='float32 16 + label, batch 256'),
    'tiny-copy': Workload(
        'tiny-copy', TinyCopy, 256,
        description='float32 16 fresh copy + Python int label, batch 256'),
    'tiny-batched': Workload(
        'tiny-batched', tiny_batched, 256, torch_batches=tiny_batches,
        description='tiny as a TupleDataset of arrays (its batch method), '
                    'batch 256'),
    'cpu': Workload('cpu', Cpu, 32,
                    description='~2 ms numpy per example, batch 32'),
    'variable': Workload(
        'variable', Variable, 64,
        converter=functools.partial(concat_examples, padding=0),
        torch_collate=_pad_collate,
        description='int32 length 10..2000, padded, batch 64'),
    'variable-labelled': Workload(
        'variable-labelled', VariableLabelled, 64,
        converter=functools.partial(concat_examples, padding=0),
        torch_collate=_pad_label_collate,
        description='int32 length 10..2000 slice copy + Python int label, '
                    'padded, batch 64'),
    'variable-packed': Workload(
        'variable-packed', VariablePacked, 64,
        converter=functools.partial(concat_examples, padding=0),
        torch_collate=_pad_label_collate,
        description='4096 int32 sequences of length 10..2000 packed in one '
                    'array, a slice copy + Python int label, padded, '
                    'batch 64'),
    'bucketed': Workload(
        'bucketed', Bucketed, 64,
        order=lambda dataset, batch_size: BlockOrder(len(dataset),
                                                     batch_size),
        description='float32 Lx64 + label, L in 16..128 by batch, batch 64'),
}


def user_function(spec):
    """The function a ``module:function`` spec names; ``ValueError`` (its
    message says what is wrong and the right form) when there is none."""
    module_name, _, function_name = spec.partition(':')
    if not module_name or not function_name:
        raise ValueError(
            '--dataset takes module:function (a function returning your '
            'dataset), e.g. mypackage.data:make_dataset; got {!r}'.format(
                spec))
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError('--dataset {}: cannot import {!r} ({}: {}); '
                         'is it on PYTHONPATH?'.format(
                             spec, module_name, type(e).__name__, e)) from e
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError('--dataset {}: module {!r} has no function {!r}; '
                         'pass module:function returning a dataset'.format(
                             spec, module_name, function_name))
    return function


def check(name):
    """Raise ``ValueError`` unless ``name`` is a built-in workload or a
    ``module:function`` that exists."""
    if name in WORKLOADS:
        return
    if ':' not in name:
        raise ValueError(
            'unknown workload {!r}: --workloads takes a comma-separated list '
            'of {} (your own datasets go in --dataset module:function)'
            .format(name, ', '.join(WORKLOADS)))
    user_function(name)


def user_workload(spec, batch_size):
    """A workload from ``module:function`` returning a dataset."""
    return Workload(spec, user_function(spec), batch_size,
                    description='user dataset')


def get(name, batch_size=None):
    if name in WORKLOADS:
        workload = WORKLOADS[name]
        if batch_size:
            workload = Workload(name, workload.make, batch_size,
                                workload.converter, workload.torch_collate,
                                workload.description, workload.order,
                                workload.torch_batches)
        return workload
    check(name)
    return user_workload(name, batch_size or 32)
