"""Train a small MLP on scikit-learn's digits with chainiter, stop half way,
and resume from the snapshot on exactly the next batch.

    pip install -e ".[demo]" && python examples/train_digits.py

The run is done twice: once without interruption, and once stopped after
half the iterations, saved to an npz snapshot (model, optimizer and
iterator together), loaded into fresh objects and finished.  Random
augmentation uses chainiter.example_rng(), so it is replayed exactly too; the
two runs end with bit-identical weights.
"""

import argparse
import os
import tempfile

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
    """Shift the 8x8 image by up to one pixel, at random."""
    image, label = example
    dy, dx = chainiter.example_rng().integers(-1, 2, size=2)
    image = numpy.roll(image, (dy, dx), axis=(0, 1))
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
        self.velocity = {k: numpy.zeros_like(v) for k, v in self.params.items()}

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


def train(model, iterator, n_iterations, log=True):
    while iterator.epoch * iterator.epoch_size + iterator.current_position \
            < n_iterations * iterator.batch_size:
        x, t = chainiter.concat_examples(next(iterator))
        loss = model.step(x, t)
        if log and iterator.is_new_epoch:
            print('  epoch {:2d}  loss {:.4f}'.format(iterator.epoch, loss))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--epochs', type=int, default=10)
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--threads', type=int, default=2)
    args = parser.parse_args()

    train_set, test_set = load_data()
    train_set = TransformDataset(train_set, augment)
    x_test, t_test = chainiter.concat_examples(
        [flatten(e) for e in test_set])
    n_iterations = args.epochs * len(train_set) // args.batch_size

    def make_iterator():
        return chainiter.MultithreadIterator(
            train_set, args.batch_size, n_threads=args.threads, seed=42)

    print('uninterrupted run, {} iterations:'.format(n_iterations))
    full = MLP()
    with make_iterator() as it:
        train(full, it, n_iterations)
    print('  test accuracy {:.3f}'.format(full.accuracy(x_test, t_test)))

    path = os.path.join(tempfile.mkdtemp(), 'snapshot.npz')
    print('interrupted run: stop after {} iterations, save {}'.format(
        n_iterations // 2, path))
    first_half = MLP()
    with make_iterator() as it:
        train(first_half, it, n_iterations // 2, log=False)
        chainiter.serializers.save_npz(path, Snapshot(first_half, it))
        stopped_at = (it.epoch, it.current_position)
    print('  stopped at epoch {}, position {}'.format(*stopped_at))

    resumed = MLP(seed=123)                # fresh objects, other init
    with make_iterator() as it:
        chainiter.serializers.load_npz(path, Snapshot(resumed, it))
        print('  resumed at epoch {}, position {}'.format(
            it.epoch, it.current_position))
        train(resumed, it, n_iterations)
    print('  test accuracy {:.3f}'.format(resumed.accuracy(x_test, t_test)))

    same = all(numpy.array_equal(full.params[k], resumed.params[k])
               for k in full.params)
    print('resumed weights bit-identical to the uninterrupted run: {}'.format(
        same))
    if not same:
        raise SystemExit(1)


if __name__ == '__main__':
    main()
