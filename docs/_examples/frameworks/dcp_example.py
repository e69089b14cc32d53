"""torch.distributed.checkpoint: the loader in the state dict that
dcp.save writes, and dcp.load into a fresh, never iterated loader."""

import sys

import numpy
import torch
import torch.distributed.checkpoint as dcp

import chainiter
from chainiter.datasets import TupleDataset


def make_loader():
    dataset = TupleDataset(numpy.zeros((10, 3), numpy.float32),
                           numpy.arange(10))
    return chainiter.MultiprocessIterator(
        dataset, batch_size=4, n_processes=2, seed=0,
        converter=chainiter.concat_examples).loader()


def main(directory):
    # [dcp]
    model = torch.nn.Linear(3, 1)
    with make_loader() as loader:
        batches = iter(loader)
        for _ in range(2):
            x, t = next(batches)
            print('batch', t.tolist())
        dcp.save({'model': model, 'loader': loader}, checkpoint_id=directory)
    print('saved')
    # Later, in a new process: fresh objects, loaded in place (DCP reads
    # their state_dict() for the layout, then calls load_state_dict()).
    model = torch.nn.Linear(3, 1)
    with make_loader() as loader:
        dcp.load({'model': model, 'loader': loader}, checkpoint_id=directory)
        for x, t in loader:                         # the rest of epoch 0
            print('batch', t.tolist())
    # [/dcp]


if __name__ == '__main__':
    main(sys.argv[1])
