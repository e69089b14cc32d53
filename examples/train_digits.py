"""Train a small MLP on scikit-learn's digits, fed by worker processes;
stop half way, snapshot, and resume on exactly the next batch.

    pip install -e ".[demo]" && python examples/train_digits.py

What it shows:

- ``MultiprocessIterator`` in stacked mode: two worker processes load the
  examples, augment them and stack each batch straight into shared memory
  (``converter=chainiter.concat_examples``); ``next()`` hands out arrays
  that view it, with no copy in this process.
- Random augmentation with ``chainiter.example_rng()``: a generator keyed
  by (seed, epoch, position), so it is the same whichever worker loads an
  example, and replayed exactly after a resume.
- A stop, a snapshot (model, optimizer and iterator in one npz file), and a
  resume into fresh objects: the resumed run ends with weights bit for bit
  those of the uninterrupted one.
- A progress bar (tqdm when installed, else a line per epoch) and the
  iterator's ``stats`` at the end.
"""

import argparse
import multiprocessing
import os
import sys
import tempfile
import time

import numpy

import chainiter
from chainiter.datasets import TransformDataset, TupleDataset, split_dataset


def load_data():
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.images / 16.0).astype(numpy.float32)        # (n, 8, 8)
    t = digits.target.astype(numpy.int32)
    return split_dataset(TupleDataset(x, t), 1437)


def augment(example):
    """Shift the 8x8 image by up to one pixel and add a little noise, at
    random (runs in a worker)."""
    image, label = example
    rng = chainiter.example_rng()
    dy, dx = rng.integers(-1, 2, size=2)
    image = numpy.roll(image, (dy, dx), axis=(0, 1))
    image = image + rng.normal(0, 0.05, size=image.shape).astype(
        numpy.float32)
    return image.reshape(-1), label


def flatten(example):
    image, label = example
    return image.reshape(-1), label


class MLP:
    def __init__(self, n_in=64, n_hidden=64, n_out=10, seed=0):
        rng = numpy.random.default_rng(seed)
        self.params = {
            'W1': (rng.standard_normal((n_in, n_hidden)) / 8).astype(
                numpy.float32),
            'b1': numpy.zeros(n_hidden, numpy.float32),
            'W2': (rng.standard_normal((n_hidden, n_out)) / 8).astype(
                numpy.float32),
            'b2': numpy.zeros(n_out, numpy.float32),
        }
        self.velocity = {k: numpy.zeros_like(v)
                         for k, v in self.params.items()}

    def forward(self, x):
        h = numpy.maximum(x @ self.params['W1'] + self.params['b1'], 0)
        return h, h @ self.params['W2'] + self.params['b2']

    def step(self, x, t, lr=0.05, momentum=0.9):
        """One SGD-with-momentum step; returns the mean cross-entropy."""
        h, logits = self.forward(x)
        logits = logits - logits.max(axis=1, keepdims=True)
        p = numpy.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = -numpy.log(p[numpy.arange(len(t)), t] + 1e-12).mean()
        g = p
        g[numpy.arange(len(t)), t] -= 1
        g /= len(t)
        grads = {'W2': h.T @ g, 'b2': g.sum(axis=0)}
        gh = (g @ self.params['W2'].T) * (h > 0)
        grads['W1'] = x.T @ gh
        grads['b1'] = gh.sum(axis=0)
        for k, grad in grads.items():
            self.velocity[k] = momentum * self.velocity[k] - lr * grad
            self.params[k] += self.velocity[k]
        return float(loss)

    def accuracy(self, x, t):
        return float((self.forward(x)[1].argmax(axis=1) == t).mean())

    def serialize(self, serializer):
        for k in self.params:
            serializer['params'](k, self.params[k])
            serializer['velocity'](k, self.velocity[k])


class Snapshot:
    """Everything a resumed run needs, saved with one save_npz."""

    def __init__(self, model, iterator):
        self.model, self.iterator = model, iterator

    def serialize(self, serializer):
        self.model.serialize(serializer['model'])
        self.iterator.serialize(serializer['iterator'])


class Progress:
    """A tqdm bar over the iterations when tqdm is installed; else a line
    at each new epoch."""

    def __init__(self, total, done, label):
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        self.bar = None if tqdm is None else tqdm(
            total=total, initial=done, desc=label, unit='batch',
            leave=False, file=sys.stderr)
        self.total = total

    def update(self, iteration, epoch, loss, new_epoch):
        if self.bar is not None:
            self.bar.update(1)
            if new_epoch:
                self.bar.set_postfix(epoch=epoch, loss='{:.4f}'.format(loss))
        elif new_epoch:
            print('  epoch {:2d}  iteration {:4d}/{}  loss {:.4f}'.format(
                epoch, iteration, self.total, loss))

    def close(self):
        if self.bar is not None:
            self.bar.close()


def iterations_done(iterator):
    return (iterator.epoch * iterator.epoch_size +
            iterator.current_position) // iterator.batch_size


def train(model, iterator, n_iterations, label):
    """Train until ``n_iterations`` batches have been consumed in all (a
    resumed iterator continues the count from its snapshot)."""
    done = iterations_done(iterator)
    progress = Progress(n_iterations, done, label)
    try:
        while done < n_iterations:
            x, t = next(iterator)          # stacked by the workers
            loss = model.step(x, t)
            done += 1
            progress.update(done, iterator.epoch, loss,
                            iterator.is_new_epoch)
    finally:
        progress.close()


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--epochs', type=int, default=30)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--processes', type=int, default=2)
    parser.add_argument('--start-method', default=None,
                        choices=['fork', 'forkserver', 'spawn'],
                        help="(default: Python's)")
    args = parser.parse_args()
    started = time.monotonic()

    train_set, test_set = load_data()
    train_set = TransformDataset(train_set, augment)
    x_test, t_test = chainiter.concat_examples(
        [flatten(e) for e in test_set])
    n_iterations = args.epochs * len(train_set) // args.batch_size

    def make_iterator():
        return chainiter.MultiprocessIterator(
            train_set, args.batch_size, n_processes=args.processes, seed=42,
            start_method=args.start_method,
            converter=chainiter.concat_examples)

    print('MultiprocessIterator, {} workers ({}), stacked batches of {}; '
          '{} training examples, {} epochs = {} iterations'.format(
              args.processes, multiprocessing.get_context(
                  args.start_method).get_start_method(), args.batch_size,
              len(train_set), args.epochs, n_iterations))

    print('uninterrupted run:')
    full = MLP()
    with make_iterator() as it:
        train(full, it, n_iterations, 'uninterrupted')
    print('  test accuracy {:.3f}'.format(full.accuracy(x_test, t_test)))

    path = os.path.join(tempfile.mkdtemp(), 'snapshot.npz')
    print('interrupted run: stop after {} iterations'.format(
        n_iterations // 2))
    first_half = MLP()
    with make_iterator() as it:
        train(first_half, it, n_iterations // 2, 'first half')
        chainiter.serializers.save_npz(path, Snapshot(first_half, it))
        print('  stopped at epoch {}, position {}; snapshot {} ({} '
              'bytes)'.format(it.epoch, it.current_position, path,
                              os.path.getsize(path)))

    resumed = MLP(seed=123)                # fresh objects, other init
    with make_iterator() as it:
        chainiter.serializers.load_npz(path, Snapshot(resumed, it))
        print('  resumed at epoch {}, position {}'.format(
            it.epoch, it.current_position))
        train(resumed, it, n_iterations, 'resumed')
        stats = it.stats
    print('  test accuracy {:.3f}'.format(resumed.accuracy(x_test, t_test)))
    print('iterator stats (resumed run): {}'.format(stats))

    same = all(numpy.array_equal(full.params[k], resumed.params[k])
               for k in full.params)
    print('resumed weights bit-identical to the uninterrupted run: {}'.format(
        same))
    print('done in {:.1f} s'.format(time.monotonic() - started))
    if not same:
        raise SystemExit(1)


if __name__ == '__main__':
    main()
