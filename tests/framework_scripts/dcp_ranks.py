"""torch.distributed.checkpoint of sharded loaders over two ranks (gloo, a
file store): each rank takes 3 steps and saves ``{'loader': loader}`` (one
key for all ranks: the sharded state is global, the same on every rank);
then two fresh ranks, and one, load it in place.  Prints, as JSON, what
each rank of each run loaded after that: the examples of its next steps.

    python dcp_ranks.py DIR
"""

import json
import os
import sys
import warnings

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

import chainiter

N, BATCH, STEPS = 10, 2, 3


def loader(rank, size, seed):
    return chainiter.SerialIterator(list(range(N)), BATCH * 2 // size,
                                    seed=seed, shard=(rank, size)).loader()


def rest(ld, steps=5):
    out, batches = [], iter(ld)
    while len(out) < steps:
        batch = next(batches, None)
        if batch is None:
            batches = iter(ld)
            continue
        out.append([int(i) for i in batch])
    return out


def rank_main(rank, size, directory, what):
    dist.init_process_group('gloo', init_method='file://' + os.path.join(
        directory, 'store-' + what), rank=rank, world_size=size)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        if what == 'save':
            ld = loader(rank, size, seed=3)
            rest(ld, STEPS)
            dcp.save({'loader': ld}, checkpoint_id=os.path.join(
                directory, 'ckpt'))
        else:
            ld = loader(rank, size, seed=3)    # a sharded run's own seed
            dcp.load({'loader': ld}, checkpoint_id=os.path.join(
                directory, 'ckpt'))
            with open(os.path.join(directory, '{}-{}.json'.format(
                    what, rank)), 'w') as f:
                json.dump(rest(ld), f)
    dist.destroy_process_group()


if __name__ == '__main__':
    directory = sys.argv[1]
    for size, what in [(2, 'save'), (2, 'load2'), (1, 'load1')]:
        # Forked ranks start with torch imported.
        mp.start_processes(rank_main, args=(size, directory, what),
                           nprocs=size, start_method='fork')
    out = {}
    for name in ('load2-0', 'load2-1', 'load1-0'):
        with open(os.path.join(directory, name + '.json')) as f:
            out[name] = json.load(f)
    print(json.dumps(out))
