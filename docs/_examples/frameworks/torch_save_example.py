"""A plain PyTorch loop: the iterator's state next to the model's in one
torch.save file, loaded with torch.load(weights_only=True)."""

import os
import sys

import numpy
import torch

import chainiter
from chainiter.datasets import TupleDataset


def make_iterator():
    rng = numpy.random.default_rng(0)
    dataset = TupleDataset(rng.normal(size=(10, 3)).astype(numpy.float32),
                           numpy.arange(10, dtype=numpy.float32))
    return chainiter.MultiprocessIterator(
        dataset, batch_size=4, n_processes=2, seed=0,
        converter=chainiter.concat_examples)


def train(it, model, optimizer, epochs, path, stop_after=None):
    steps = 0
    for epoch in range(it.epoch, epochs):
        for x, t in it.one_epoch():        # the rest of it after a resume
            x, t = chainiter.to_device('@torch', (x, t))
            print('epoch', epoch, 'batch', t.long().tolist())
            loss = (model(x).squeeze(1) - t).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            torch.save({'model': model.state_dict(),
                        'optimizer': optimizer.state_dict(),
                        'iterator': it.state_dict()}, path)
            if steps == stop_after:
                return


def main(directory):
    path = os.path.join(directory, 'checkpoint.pt')
    # [loop]
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with make_iterator() as it:
        train(it, model, optimizer, 3, path, stop_after=4)   # interrupted
    print('stopped')
    # A new process: fresh objects, the checkpoint loaded.
    checkpoint = torch.load(path, weights_only=True)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model.load_state_dict(checkpoint['model'])
    optimizer.load_state_dict(checkpoint['optimizer'])
    with make_iterator() as it:
        it.load_state_dict(checkpoint['iterator'])
        train(it, model, optimizer, 3, path)
    # [/loop]
    print('weights', [round(w, 6) for w in model.weight.ravel().tolist()])


if __name__ == '__main__':
    main(sys.argv[1])
