"""Data-parallel training over MPI ranks with a sharded chainiter iterator:
every rank builds the same dataset, loads its share of each global batch,
and the gradients are averaged with comm.allreduce.

    pip install -e . mpi4py mpich
    mpiexec -n 2 python examples/train_mpi.py

The run is done twice, as examples/train_digits.py does: once without
interruption, and once stopped half way, saved (rank 0 writes one
snapshot: the iterator's state is the global position, the same on every
rank), loaded on every rank and finished; both end with the same weights.
Elastic resume, on another number of ranks::

    mpiexec -n 2 python examples/train_mpi.py --stop-at 40 --save s.npz
    mpiexec -n 3 python examples/train_mpi.py --load s.npz

goes on with exactly the examples the 2-rank run would have seen next,
cut into global batches of 3 x the batch size.  Rank 0 prints each rank's
throughput and the total.
"""

import argparse
import time

import numpy

import chainiter
from chainiter import distributed


class Blobs:
    """A synthetic classification set, the same on every rank: example i is
    (features, label), with noise drawn from example_rng() (augmentation
    that does not depend on the number of ranks)."""

    def __init__(self, n=6000, dim=64, classes=10, seed=0, work=0):
        rng = numpy.random.default_rng(seed)
        self.centers = rng.standard_normal((classes, dim)).astype(
            numpy.float32)
        self.labels = rng.integers(0, classes, size=n).astype(numpy.int32)
        self.work = work

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        rng = chainiter.example_rng()
        x = self.centers[self.labels[i]] + rng.standard_normal(
            self.centers.shape[1], dtype=numpy.float32) * 1.5
        for _ in range(self.work):        # stands in for decoding a file
            x = numpy.tanh(x) * 1.0001 + 1e-7
        return x, self.labels[i]


class Softmax:
    """A linear softmax classifier; its gradients are separate from the
    update so that the ranks can average them first."""

    def __init__(self, dim=64, classes=10):
        self.params = {'W': numpy.zeros((dim, classes), numpy.float32),
                       'b': numpy.zeros(classes, numpy.float32)}

    def gradients(self, x, t, n_global):
        """Sum over this rank's rows, divided by the global batch size:
        summed over the ranks, the gradient of the global batch's mean."""
        logits = x @ self.params['W'] + self.params['b']
        logits -= logits.max(axis=1, keepdims=True)
        p = numpy.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        loss = -numpy.log(p[numpy.arange(len(t)), t] + 1e-12).sum()
        p[numpy.arange(len(t)), t] -= 1
        p /= n_global
        return {'W': x.T @ p, 'b': p.sum(axis=0)}, loss / n_global

    def update(self, grads, lr=0.5):
        for k, g in grads.items():
            self.params[k] -= lr * g

    def serialize(self, serializer):
        for k in self.params:
            self.params[k][...] = serializer(k, self.params[k])


class Snapshot:
    def __init__(self, model, iterator):
        self.model, self.iterator = model, iterator

    def serialize(self, serializer):
        self.model.serialize(serializer['model'])
        self.iterator.serialize(serializer['iterator'])


def examples_seen(it):
    return it.epoch * it.epoch_size + it.current_position


def train(comm, model, it, until):
    """Steps until the run has seen ``until`` examples over all ranks;
    returns (steps, seconds, examples this rank loaded)."""
    steps = loaded = 0
    start = time.perf_counter()
    while examples_seen(it) < until:
        x, t = chainiter.concat_examples(next(it))
        grads, loss = model.gradients(x, t, it.global_batch_size)
        grads = {k: comm.allreduce(g) for k, g in grads.items()}
        model.update(grads)
        steps += 1
        loaded += len(t)
        if it.is_new_epoch and comm.Get_rank() == 0:
            print('  epoch {:2d}  loss {:.4f}'.format(
                it.epoch, comm.allreduce(loss)), flush=True)
        elif it.is_new_epoch:
            comm.allreduce(loss)
    return steps, time.perf_counter() - start, loaded


def report(comm, what, steps, seconds, loaded):
    rows = comm.gather((steps, seconds, loaded), root=0)
    if comm.Get_rank() != 0:
        return
    print('{}: {} ranks'.format(what, len(rows)))
    for rank, (s, sec, n) in enumerate(rows):
        print('  rank {}: {} steps, {} examples in {:.2f} s, {:.0f} '
              'examples/s'.format(rank, s, n, sec, n / max(sec, 1e-9)))
    total = sum(n for _, _, n in rows)
    slowest = max(sec for _, sec, _ in rows)
    print('  total: {} examples, {:.0f} examples/s'.format(
        total, total / max(slowest, 1e-9)), flush=True)


def weights_agree(comm, model):
    mine = numpy.concatenate([v.ravel() for v in model.params.values()])
    return all(numpy.array_equal(mine, other)
               for other in comm.allgather(mine))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--epochs', type=float, default=3)
    parser.add_argument('--batch-size', type=int, default=32,
                        help='examples per rank and step')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--work', type=int, default=20,
                        help='cost of loading one example')
    parser.add_argument('--stop-at', type=int, default=None,
                        help='steps before saving to --save and stopping')
    parser.add_argument('--save', default=None)
    parser.add_argument('--load', default=None)
    args = parser.parse_args()

    comm = distributed.world()
    rank = comm.Get_rank()
    dataset = Blobs(work=args.work)
    until = int(args.epochs * len(dataset))

    def make_iterator():
        # seed=None: rank 0 draws it and sends it to the others.
        return chainiter.MultithreadIterator(
            dataset, args.batch_size, n_threads=args.threads, shard=comm)

    if args.save or args.load:          # one leg of an elastic run
        model = Softmax()
        with make_iterator() as it:
            if args.load:
                chainiter.serializers.load_npz(args.load, Snapshot(model, it))
                if rank == 0:
                    print('resumed at epoch {}, position {} (global batch '
                          '{})'.format(it.epoch, it.current_position,
                                       it.global_batch_size), flush=True)
            stop = until if args.stop_at is None else min(
                until, examples_seen(it) + args.stop_at * it.global_batch_size)
            report(comm, 'training', *train(comm, model, it, stop))
            if args.save and rank == 0:
                chainiter.serializers.save_npz(args.save, Snapshot(model, it))
                print('saved {} at epoch {}, position {}'.format(
                    args.save, it.epoch, it.current_position), flush=True)
        return

    if rank == 0:
        print('uninterrupted run, {} examples:'.format(until), flush=True)
    full = Softmax()
    with make_iterator() as it:
        report(comm, 'uninterrupted', *train(comm, full, it, until))
        seed = it.seed

    half = until // 2
    first = Softmax()
    with chainiter.MultithreadIterator(
            dataset, args.batch_size, n_threads=args.threads, seed=seed,
            shard=comm) as it:
        train(comm, first, it, half)
        state = it.state_dict()           # the same on every rank
        weights = {k: v.copy() for k, v in first.params.items()}
    resumed = Softmax()
    resumed.params = weights
    with make_iterator() as it:
        it.load_state_dict(state)
        if rank == 0:
            print('stopped and resumed at epoch {}, position {}'.format(
                it.epoch, it.current_position), flush=True)
        train(comm, resumed, it, until)
    same = all(numpy.array_equal(full.params[k], resumed.params[k])
               for k in full.params)
    agree = weights_agree(comm, resumed)
    if rank == 0:
        print('ranks hold the same weights: {}; resumed weights identical '
              'to the uninterrupted run: {}'.format(agree, same), flush=True)
    if not (same and agree):
        raise SystemExit(1)


if __name__ == '__main__':
    main()
