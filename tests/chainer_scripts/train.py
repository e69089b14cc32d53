"""Train a small classifier with Chainer's Trainer on a chainiter iterator,
passed in the plain form: ``StandardUpdater(train_iter, optimizer)``,
``Evaluator(test_iter, model)``, with ``LogReport`` and ``snapshot()``.
Run by test_chainer_differential.py in a venv with Chainer.

    python train.py KIND OUT full-and-stop   # 12 iterations in OUT/full,
                                             # then 6 in OUT/stopped
    python train.py KIND OUT resume          # OUT/stopped's snapshot_iter_6
                                             # in a new process, to 12

Prints one JSON line: per run, a digest of the final weights, the final
iteration and epoch_detail, and the last log entry.
"""

import hashlib
import json
import multiprocessing
import os
import sys

import numpy

import chainiter

# Imported in main(): spawned workers run this module's top level again.
chainer = None

N_ITERATIONS = 12
STOP_AT = 6


class Noisy:
    """40 examples of 8 features and a label of 3 classes, with noise from
    example_rng(): a resumed run must key every example as the first did."""

    def __init__(self):
        rng = numpy.random.RandomState(0)
        self.x = rng.normal(size=(40, 8)).astype(numpy.float32)
        self.t = (self.x[:, 0] > 0).astype(numpy.int32) + (
            self.x[:, 1] > 1).astype(numpy.int32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        noise = chainiter.example_rng().normal(scale=0.1, size=8)
        return (self.x[i] + noise).astype(numpy.float32), self.t[i]


def make_iterators(kind):
    train, test = Noisy(), chainiter.datasets.TupleDataset(
        numpy.ones((10, 8), numpy.float32), numpy.zeros(10, numpy.int32))
    if kind == 'serial':
        make = chainiter.SerialIterator
    elif kind == 'thread':
        def make(*a, **k):
            return chainiter.MultithreadIterator(*a, n_threads=2, **k)
    else:
        method = kind.split('-', 1)[1]

        def make(*a, **k):
            return chainiter.MultiprocessIterator(
                *a, n_processes=2, start_method=method, **k)
    return (make(train, 6, seed=0),
            make(test, 4, repeat=False, shuffle=False))


def make_trainer(kind, out, stop_at):
    from chainer import links, optimizers, training
    from chainer.training import extensions
    numpy.random.seed(0)        # Chainer's initializers draw from it
    model = links.Classifier(links.Linear(8, 3))
    optimizer = optimizers.MomentumSGD(lr=0.1)
    optimizer.setup(model)
    train_iter, test_iter = make_iterators(kind)
    updater = training.updaters.StandardUpdater(train_iter, optimizer)
    trainer = training.Trainer(updater, (stop_at, 'iteration'), out=out)
    trainer.extend(extensions.Evaluator(test_iter, model),
                   trigger=(3, 'iteration'))
    trainer.extend(extensions.LogReport(trigger=(3, 'iteration')))
    trainer.extend(extensions.snapshot(
        filename='snapshot_iter_{.updater.iteration}'),
        trigger=(3, 'iteration'))
    return trainer, model, train_iter


def outcome(trainer, model, train_iter):
    digest = hashlib.sha256()
    for name, param in sorted(model.namedparams()):
        digest.update(name.encode())
        digest.update(param.array.tobytes())
    log = trainer.get_extension('LogReport').log
    return {'weights': digest.hexdigest(),
            'iteration': trainer.updater.iteration,
            'epoch_detail': train_iter.epoch_detail,
            'log': log[-1] if log else None,
            'snapshots': sorted(os.listdir(trainer.out))}


def main():
    global chainer
    import chainer
    kind, out, mode = sys.argv[1:4]
    if kind == 'mp-forkserver':
        # As in the suite (conftest.py): the forkserver's workers fork
        # with chainiter imported, not importing it each.
        multiprocessing.set_forkserver_preload(['chainiter'])
    result = {}
    if mode == 'full-and-stop':
        for name, stop_at in (('full', N_ITERATIONS), ('stopped', STOP_AT)):
            trainer, model, train_iter = make_trainer(
                kind, os.path.join(out, name), stop_at)
            trainer.run()
            result[name] = outcome(trainer, model, train_iter)
    else:
        trainer, model, train_iter = make_trainer(
            kind, os.path.join(out, 'resumed'), N_ITERATIONS)
        chainer.serializers.load_npz(os.path.join(
            out, 'stopped', 'snapshot_iter_{}'.format(STOP_AT)), trainer)
        trainer.run()
        result['resumed'] = outcome(trainer, model, train_iter)
    print(json.dumps(result))


if __name__ == '__main__':
    main()
