"""Run the same scenarios through Chainer 7.8.1's SerialIterator and one
chainiter iterator kind; print, as one JSON line, each scenario's record
from both.  Run by test_chainer_differential.py in a venv with Chainer.

    python differential.py KIND TMPDIR      (KIND: serial, thread, mp-METHOD)
"""

import json
import multiprocessing
import os
import sys

import numpy

import chainiter

# Imported in main(): spawned workers run this module's top level again,
# and need nothing of Chainer.
chainer = None


class Oversample:
    """Every example twice, in a fixed order."""

    def __call__(self, order, position):
        return numpy.repeat(numpy.arange(3), 2)


class Balanced:
    """A stateful order of 8 indices into a dataset of 5."""

    def __init__(self, seed):
        self.random = numpy.random.RandomState(seed)

    def __call__(self, order, position):
        return self.random.permutation([0, 0, 0, 0, 1, 2, 3, 4])


class Shrinking:
    """Orders of 6, 6, then 5 indices: Chainer raises ValueError."""

    def __init__(self):
        self.calls = 0

    def __call__(self, order, position):
        self.calls += 1
        return numpy.arange(6 if self.calls < 3 else 5) % 3


def make_chainiter(kind):
    if kind == 'serial':
        return chainiter.SerialIterator
    if kind == 'thread':
        return lambda *a, **k: chainiter.MultithreadIterator(
            *a, n_threads=2, **k)
    method = kind.split('-', 1)[1]
    return lambda *a, **k: chainiter.MultiprocessIterator(
        *a, n_processes=2, start_method=method, **k)


def attributes(it):
    return [it.epoch, it.current_position, bool(it.is_new_epoch),
            round(float(it.epoch_detail), 12),
            None if it.previous_epoch_detail is None
            else round(float(it.previous_epoch_detail), 12)]


def plain(value):
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, numpy.generic):
        return value.item()
    return value


def step(it):
    """One next(): what it returned or raised, and the attributes after."""
    try:
        got = ['batch', plain(next(it))]
    except StopIteration:
        got = ['stop']
    except ValueError as e:
        # chainiter leaves the iterator as it was when next() raises;
        # Chainer has already moved previous_epoch_detail: not compared.
        return ['ValueError', 'size of order' in str(e)] + attributes(it)[:4]
    return got + attributes(it)


def run(it, actions):
    """``actions``: a string of 'n' (next) and 'r' (reset)."""
    out = [attributes(it)]
    for action in actions:
        if action == 'n':
            out.append(step(it))
        else:
            it.reset()
            out.append(['reset'] + attributes(it))
    return out


# (name, dataset, batch size, options factory, actions)
SCENARIOS = [
    ('in-order, repeat', list(range(7)), 3,
     lambda: dict(shuffle=False), 'n' * 8),
    ('in-order, no repeat, past the stop', list(range(7)), 3,
     lambda: dict(shuffle=False, repeat=False), 'n' * 5),
    ('divisible, no repeat', list(range(6)), 3,
     lambda: dict(shuffle=False, repeat=False), 'n' * 4),
    ('batch larger than the dataset', list(range(3)), 5,
     lambda: dict(shuffle=False), 'n' * 4),
    ('shuffle order sampler', list(range(10)), 4,
     lambda: dict(order_sampler=OrderSamplers.shuffle(3)), 'n' * 9),
    ('oversampling sampler, repeat', [1, 2, 3], 2,
     lambda: dict(order_sampler=Oversample()), 'n' * 8),
    ('oversampling sampler, no repeat', [1, 2, 3], 4,
     lambda: dict(order_sampler=Oversample(), repeat=False), 'n' * 4),
    ('longer order than the dataset', list(range(5)), 3,
     lambda: dict(order_sampler=Balanced(5)), 'n' * 9),
    ('order of another length later', [1, 2, 3], 3,
     lambda: dict(order_sampler=Shrinking()), 'n' * 5),
    ('per-epoch loop with reset, in order', list(range(5)), 2,
     lambda: dict(shuffle=False, repeat=False), 'nnnnrnnnnr' + 'nnnn'),
    ('per-epoch loop with reset, shuffled', list(range(5)), 2,
     lambda: dict(order_sampler=OrderSamplers.shuffle(1), repeat=False),
     'nnnnrnnnnrnnnn'),
    ('reset mid-epoch', list(range(7)), 3,
     lambda: dict(order_sampler=OrderSamplers.shuffle(2)), 'nnrnnnrn'),
]


class OrderSamplers:
    """Each library's own ShuffleOrderSampler over a seeded RandomState:
    the same orders."""
    library = None

    @classmethod
    def shuffle(cls, seed):
        return cls.library.iterators.ShuffleOrderSampler(
            numpy.random.RandomState(seed))


def scenarios(kind):
    make = make_chainiter(kind)
    out = {}
    for name, dataset, batch_size, options, actions in SCENARIOS:
        OrderSamplers.library = chainer
        ref = chainer.iterators.SerialIterator(dataset, batch_size,
                                               **options())
        expected = run(ref, actions)
        OrderSamplers.library = chainiter
        with make(dataset, batch_size, **options()) as it:
            got = run(it, actions)
        out[name] = [expected, got]
    return out


# ---- snapshots both ways ----------------------------------------------------

SNAPSHOT_CASES = [
    # (name, dataset, batch size, options for both, steps)
    ('in-order', list(range(7)), 3, dict(shuffle=False), 7),
    ('in-order, no repeat', list(range(7)), 3,
     dict(shuffle=False, repeat=False), 4),
    ('oversampling', [1, 2, 3], 4, dict(order_sampler=Oversample()), 6),
]


def continue_run(it, n):
    return [step(it) for _ in range(n)]


def snapshots(kind, tmp):
    make = make_chainiter(kind)
    out = {}
    saves = {'chainer': chainer.serializers.save_npz,
             'chainiter': chainiter.serializers.save_npz}
    loads = {'chainer': chainer.serializers.load_npz,
             'chainiter': chainiter.serializers.load_npz}
    if kind != 'serial':
        # The serializers are the same for every kind: each library's own
        # for the transports.
        saves = {'chainer': saves['chainer']}
        loads = {'chainiter': loads['chainiter']}
        saves_of_chainiter = {'chainiter': chainiter.serializers.save_npz}
    else:
        saves_of_chainiter = saves
    for name, dataset, batch_size, options, steps in SNAPSHOT_CASES:
        for k in range(steps):
            # Chainer's iterator saved; loaded into chainiter's.
            for saver in saves:
                for loader in loads:
                    ref = chainer.iterators.SerialIterator(
                        dataset, batch_size, **options)
                    for _ in range(k):
                        step(ref)
                    # A trainer-style name: no suffix.
                    path = os.path.join(tmp, 'snapshot_iter_{}'.format(k))
                    saves[saver](path, ref)
                    expected = [attributes(ref)] + continue_run(ref, 4)
                    with make(dataset, batch_size, **options) as it:
                        loads[loader](path, it)
                        got = [attributes(it)] + continue_run(it, 4)
                    out['{}: chainer -> chainiter after {} steps, saved by '
                        '{}, loaded by {}'.format(name, k, saver, loader)] = [
                            expected, got]
            # chainiter's iterator saved; loaded into Chainer's.
            for saver in saves_of_chainiter:
                with make(dataset, batch_size, **options) as it:
                    for _ in range(k):
                        step(it)
                    path = os.path.join(tmp, 'snapshot_iter_{}'.format(k))
                    saves_of_chainiter[saver](path, it)
                    expected = [attributes(it)] + continue_run(it, 4)
                ref = chainer.iterators.SerialIterator(dataset, batch_size,
                                                       **options)
                chainer.serializers.load_npz(path, ref)
                got = [attributes(ref)] + continue_run(ref, 4)
                out['{}: chainiter -> chainer after {} steps, saved by '
                    '{}'.format(name, k, saver)] = [expected, got]
    return out


def make_chainer(kind):
    """Chainer's iterator of the same kind as ``make_chainiter(kind)``."""
    if kind == 'serial':
        return chainer.iterators.SerialIterator
    if kind == 'thread':
        return lambda *a, **k: chainer.iterators.MultithreadIterator(
            *a, n_threads=2, **k)
    return lambda *a, **k: chainer.iterators.MultiprocessIterator(
        *a, n_processes=2, **k)


def rest_of_epoch(it, batch_size):
    """The batches that lie wholly in the epoch in progress (the orders of
    later epochs are each library's own)."""
    size = len(it.dataset)
    return [step(it) for _ in range((size - it.current_position)
                                    // batch_size)]


def shuffled_snapshots(kind, tmp):
    """A shuffled iterator's snapshot, saved with Chainer's save_npz (as
    its Trainer's snapshot extension does), into the other library's
    iterator of the same kind: the epoch in progress goes on alike.  One
    chainiter iterator serves throughout (workers start slowly)."""
    out = {}
    dataset, batch_size = list(range(10)), 3
    make_ref = make_chainer(kind)
    loads = {'chainer': chainer.serializers.load_npz,
             'chainiter': chainiter.serializers.load_npz}
    with make_chainiter(kind)(dataset, batch_size, seed=5) as it:
        start = it.state_dict()
        # Chainer's MultiprocessIterator starts its own processes for
        # every reference: a mid-epoch and a wrapped snapshot there.
        for k in (0, 2, 4) if kind in ('serial', 'thread') else (2, 4):
            path = os.path.join(tmp, 'snapshot_iter_{}'.format(k))
            it.load_state_dict(start)
            for _ in range(k):
                step(it)
            chainer.serializers.save_npz(path, it)
            expected = [attributes(it)] + rest_of_epoch(it, batch_size)
            with make_ref(dataset, batch_size) as ref:
                chainer.serializers.load_npz(path, ref)
                got = [attributes(ref)] + rest_of_epoch(ref, batch_size)
            out['shuffled: chainiter -> chainer, same kind, after {} '
                'steps'.format(k)] = [got, expected]
            numpy.random.seed(k)
            with make_ref(dataset, batch_size) as ref:
                for _ in range(k):
                    step(ref)
                chainer.serializers.save_npz(path, ref)
                expected = [attributes(ref)] + rest_of_epoch(ref, batch_size)
            for loader in loads:
                loads[loader](path, it)
                got = [attributes(it)] + rest_of_epoch(it, batch_size)
                out['shuffled: chainer -> chainiter, same kind, after {} '
                    'steps, loaded by {}'.format(k, loader)] = [expected, got]
    return out


def backward_compat(kind):
    """Chainer's unit test test_iterator_serialize_backward_compat, with
    its DummySerializer, on each library's iterator of this kind: a
    shuffled snapshot as older Chainer versions wrote it ('_order', and
    no previous_epoch_detail, which MultithreadIterator always needs)."""
    from chainer import serializer

    class DummySerializer(serializer.Serializer):

        def __init__(self, target):
            super(DummySerializer, self).__init__()
            self.target = target

        def __getitem__(self, key):
            raise NotImplementedError

        def __call__(self, key, value):
            self.target[key] = value
            return self.target[key]

    class DummyDeserializer(serializer.Deserializer):

        def __init__(self, target):
            super(DummyDeserializer, self).__init__()
            self.target = target

        def __getitem__(self, key):
            raise NotImplementedError

        def __call__(self, key, value):
            if value is None:
                value = self.target[key]
            elif isinstance(value, numpy.ndarray):
                numpy.copyto(value, self.target[key])
            else:
                value = type(value)(numpy.asarray(self.target[key]))
            return value

    def run(make):
        dataset = [1, 2, 3, 4, 5, 6]
        with make(dataset, 2) as it:
            batches = next(it) + next(it)
            target = {}
            it.serialize(DummySerializer(target))
        if 'order' in target:
            target['_order'] = target.pop('order')
        if kind != 'thread':
            del target['previous_epoch_detail']
        with make(dataset, 2) as it:
            it.serialize(DummyDeserializer(target))
            record = [attributes(it)]
            batches += next(it)
            record.append(attributes(it))
        return record + [sorted(batches) == dataset]

    return {'backward compat (Chainer\'s unit test)': [
        run(make_chainer(kind)), run(make_chainiter(kind))]}


def datasets():
    """Chainer's dataset splitting functions against chainiter's."""
    out = {}
    data = list(range(11))
    for library in (chainer, chainiter):
        d = library.datasets
        record = {
            'split_dataset_n': [list(p) for p in d.split_dataset_n(data, 3)],
            'split_dataset_n order': [list(p) for p in d.split_dataset_n(
                data, 2, list(range(10, -1, -1)))],
            'split_dataset_n_random': [
                list(p) for p in d.split_dataset_n_random(data, 4, seed=3)],
            'cross validation': [
                [list(a), list(b)]
                for a, b in d.get_cross_validation_datasets(data, 3)],
            'cross validation order': [
                [list(a), list(b)] for a, b in d.get_cross_validation_datasets(
                    data, 4, order=numpy.random.RandomState(2).permutation(11))
            ],
            'cross validation random': [
                [list(a), list(b)]
                for a, b in d.get_cross_validation_datasets_random(
                    data, 5, seed=7)],
            'split_dataset_random': [
                list(p) for p in d.split_dataset_random(data, 4, seed=1)],
        }
        for key, value in record.items():
            out.setdefault('datasets: ' + key, []).append(plain(value))
    return out


def main():
    global chainer
    import chainer
    kind, tmp = sys.argv[1], sys.argv[2]
    if kind == 'mp-forkserver':
        # As in the suite (conftest.py): the forkserver's workers fork
        # with chainiter imported, not importing it each.
        multiprocessing.set_forkserver_preload(['chainiter'])
    out = scenarios(kind)
    out.update(snapshots(kind, tmp))
    out.update(shuffled_snapshots(kind, tmp))
    out.update(backward_compat(kind))
    if kind == 'serial':
        out.update(datasets())
    print(json.dumps(out))


if __name__ == '__main__':
    main()
