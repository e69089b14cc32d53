"""Run by tests/test_mpi.py under ``mpiexec -n R``: each rank writes what it
loaded to OUT/<mode>-rank<r>.json.

    python shard_run.py OUT order     sharded iterators of every kind (the
                                      seed from rank 0; a seed per rank is
                                      refused), ChainerMN's API
    python shard_run.py OUT save K    k steps, rank 0 saves OUT/snap.npz
    python shard_run.py OUT resume    loads OUT/snap.npz, goes on
"""

import json
import os
import sys

import chainiter
from chainiter import distributed

N = 23
BATCH = 3
SEED = 11


class KeyedDataset:
    """Example i is (i, a number from example_rng())."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return [int(i), int(chainiter.example_rng().integers(2 ** 62))]


def make(kind, comm, rank, **kwargs):
    if kind == 0:
        return chainiter.SerialIterator(KeyedDataset(), BATCH, **kwargs)
    if kind == 1:
        return chainiter.MultithreadIterator(KeyedDataset(), BATCH,
                                             n_threads=2, **kwargs)
    return chainiter.MultiprocessIterator(
        KeyedDataset(), BATCH, n_processes=1, start_method='fork', **kwargs)


def steps(it, count):
    out = []
    for _ in range(count):
        try:
            batch = next(it)
        except StopIteration:
            break
        out.append({'batch': batch, 'epoch': it.epoch,
                    'is_new_epoch': it.is_new_epoch,
                    'epoch_detail': it.epoch_detail,
                    'padding': it.padding})
    return out


def main(out, mode, *args):
    comm = distributed.world()
    rank, size = comm.Get_rank(), comm.Get_size()
    result = {'rank': rank, 'size': size}
    kind = rank % 3
    if mode == 'order':
        with make(kind, comm, rank, shard=comm) as it:
            result['seed'] = it.seed
            result['repeat'] = steps(it, 3 * N // (size * BATCH) + 2)
        with make(kind, comm, rank, repeat=False, seed=result['seed'],
                  shard=(rank, size)) as it:
            result['once'] = steps(it, N)
        try:        # a seed per rank: every rank refuses, naming them
            make(kind, comm, rank, seed=1234 + rank, shard=comm).finalize()
        except ValueError as e:
            result['seed_error'] = str(e)
        share = distributed.scatter_dataset(
            list(range(N)) if rank == 0 else None, comm, shuffle=True,
            seed=1)
        result['scatter_dataset'] = [int(x) for x in share]
        pieces = distributed.scatter_dataset(       # pickle sent in pieces
            list(range(N)) if rank == 0 else None, comm, shuffle=True,
            seed=1, max_buf_len=16)
        result['scatter_pieces'] = [int(x) for x in pieces]
        result['scatter_index'] = list(distributed.scatter_index(
            N, comm, force_equal_length=False))
        synced = distributed.create_synchronized_iterator(
            chainiter.SerialIterator(KeyedDataset(), 4, seed=100 + rank),
            comm)
        result['synchronized'] = [synced.seed, next(synced)]
    elif mode == 'save':
        k = int(args[0])
        with make(kind, comm, rank, seed=SEED, shard=comm) as it:
            result['steps'] = steps(it, k)
            result['state'] = it.state_dict()
            if rank == 0:
                chainiter.serializers.save_npz(
                    os.path.join(out, 'snap.npz'), it)
    else:
        with make(kind, comm, rank, shard=comm) as it:
            chainiter.serializers.load_npz(os.path.join(out, 'snap.npz'), it)
            result['seed'] = it.seed
            result['steps'] = steps(it, 2 * N // (size * BATCH) + 1)
    name = os.path.join(out, '{}-rank{}.json'.format(mode, rank))
    with open(name, 'w') as f:
        json.dump(result, f)
    comm.Barrier()


if __name__ == '__main__':
    main(*sys.argv[1:])
