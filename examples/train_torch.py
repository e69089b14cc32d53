"""Train a PyTorch model fed by chainiter: batches stacked by worker
processes in shared memory, handed to torch without a copy.

    pip install torch && python examples/train_torch.py

The data is made here (points around ten class centres, jittered at random
with ``chainiter.example_rng()``), so nothing but numpy, torch and chainiter
is needed.  ``torch.from_numpy`` wraps the batch's arrays, which view the
shared memory the workers wrote: nothing is copied between the workers and
the model.  The tensor keeps the array alive, and chainiter does not reuse
that memory while it is, so holding a batch is safe.

The run stops half way and saves the iterator (chainiter's npz snapshot)
next to the model and optimizer (``torch.save``); fresh objects loaded from
them finish the run, and the weights end bit-identical to an uninterrupted
run.
"""

import argparse
import os
import tempfile
import time

import numpy
import torch

import chainiter
from chainiter.datasets import TransformDataset, split_dataset

N_FEATURES = 32
N_CLASSES = 10


class Blobs:
    """``n`` points in ``N_FEATURES`` dimensions around ``N_CLASSES``
    centres; example i is ``(point, label)``."""

    def __init__(self, n, seed=0):
        rng = numpy.random.default_rng(seed)
        centres = 0.4 * rng.standard_normal((N_CLASSES, N_FEATURES))
        self.labels = rng.integers(0, N_CLASSES, size=n)
        self.points = (centres[self.labels] + rng.standard_normal(
            (n, N_FEATURES))).astype(numpy.float32)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.points[i], numpy.int64(self.labels[i])


def jitter(example):
    """Random augmentation, replayed exactly after a resume."""
    point, label = example
    noise = chainiter.example_rng().normal(0, 0.2, size=point.shape)
    return point + noise.astype(numpy.float32), label


def make_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(N_FEATURES, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, N_CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, optimizer


def train(model, optimizer, iterator, n_iterations):
    model.train()
    done = (iterator.epoch * iterator.epoch_size +
            iterator.current_position) // iterator.batch_size
    while done < n_iterations:
        x_array, t_array = next(iterator)
        x, t = torch.from_numpy(x_array), torch.from_numpy(t_array)
        assert x.data_ptr() == x_array.ctypes.data      # no copy
        loss = torch.nn.functional.cross_entropy(model(x), t)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        done += 1
        if iterator.is_new_epoch:
            print('  epoch {:2d}  loss {:.4f}'.format(iterator.epoch,
                                                       loss.item()))


def accuracy(model, dataset):
    x, t = chainiter.concat_examples([dataset[i]
                                      for i in range(len(dataset))])
    model.eval()
    with torch.no_grad():
        predicted = model(torch.from_numpy(x)).argmax(dim=1)
    return (predicted == torch.from_numpy(t)).double().mean().item()


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--epochs', type=int, default=6)
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--processes', type=int, default=2)
    parser.add_argument('--start-method', default=None,
                        choices=['fork', 'forkserver', 'spawn'],
                        help="(default: Python's)")
    args = parser.parse_args()
    started = time.monotonic()
    torch.set_num_threads(1)        # the same sums in every run

    train_set, test_set = split_dataset(Blobs(6000), 5000)
    train_set = TransformDataset(train_set, jitter)
    n_iterations = args.epochs * len(train_set) // args.batch_size

    def make_iterator():
        return chainiter.MultiprocessIterator(
            train_set, args.batch_size, n_processes=args.processes, seed=7,
            start_method=args.start_method,
            converter=chainiter.concat_examples)

    print('uninterrupted run, {} iterations:'.format(n_iterations))
    full, optimizer = make_model()
    with make_iterator() as it:
        train(full, optimizer, it, n_iterations)
    print('  test accuracy {:.3f}'.format(accuracy(full, test_set)))

    folder = tempfile.mkdtemp()
    print('interrupted run: stop after {} iterations, save to {}'.format(
        n_iterations // 2, folder))
    model, optimizer = make_model()
    with make_iterator() as it:
        train(model, optimizer, it, n_iterations // 2)
        chainiter.serializers.save_npz(os.path.join(folder, 'iterator.npz'),
                                       it)
        torch.save({'model': model.state_dict(),
                    'optimizer': optimizer.state_dict()},
                   os.path.join(folder, 'model.pt'))

    model, optimizer = make_model()       # fresh objects
    state = torch.load(os.path.join(folder, 'model.pt'))
    model.load_state_dict(state['model'])
    optimizer.load_state_dict(state['optimizer'])
    with make_iterator() as it:
        chainiter.serializers.load_npz(
            os.path.join(folder, 'iterator.npz'), it)
        print('  resumed at epoch {}, position {}'.format(
            it.epoch, it.current_position))
        train(model, optimizer, it, n_iterations)
        print('iterator stats (resumed run): {}'.format(it.stats))
    print('  test accuracy {:.3f}'.format(accuracy(model, test_set)))

    same = all(torch.equal(a, b) for a, b in zip(full.parameters(),
                                                 model.parameters()))
    print('resumed weights bit-identical to the uninterrupted run: {}'.format(
        same))
    print('done in {:.1f} s'.format(time.monotonic() - started))
    if not same:
        raise SystemExit(1)


if __name__ == '__main__':
    main()
