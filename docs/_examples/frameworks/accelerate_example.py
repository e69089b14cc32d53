"""Accelerate: the loader registered for checkpointing, save_state after 4
batches, load_state into a fresh loader."""

import sys

import numpy
from accelerate import Accelerator

import chainiter
from chainiter.datasets import TupleDataset


def make_loader():
    dataset = TupleDataset(numpy.zeros((10, 3), numpy.float32),
                           numpy.arange(10))
    return chainiter.MultiprocessIterator(
        dataset, batch_size=4, n_processes=2, seed=0, repeat=False,
        converter=chainiter.concat_examples).loader()


def train(loader, epochs, stop_after=None):
    done = 0
    for epoch in range(epochs):
        for x, t in loader:
            print('batch', t.tolist())
            done += 1
            if done == stop_after:
                return


def main(directory):
    # [accelerate]
    accelerator = Accelerator(cpu=True)
    with make_loader() as loader:
        assert accelerator.prepare(loader) is loader   # handed back as is
        accelerator.register_for_checkpointing(loader)
        train(loader, 2, stop_after=4)
        accelerator.save_state(directory)          # the loader's state too
    print('saved')
    with make_loader() as loader:                  # later, a new process
        accelerator = Accelerator(cpu=True)
        accelerator.register_for_checkpointing(loader)
        accelerator.load_state(directory)
        for x, t in loader:                         # the rest of pass 1
            print('batch', t.tolist())
    # [/accelerate]


if __name__ == '__main__':
    main(sys.argv[1])
