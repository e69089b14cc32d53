"""Examples per second from a HuggingFace Dataset (numpy format), read by
chainiter's MultiprocessIterator and by torch's DataLoader with the same
number of worker processes, the same batch size and a shuffle, in one run:

    python docs/_examples/frameworks/hf_speed.py [N] [PASSES]

Both read batches through the Dataset's __getitems__; each loader's time
runs from its construction (its workers' start included) to the end of
the last pass.
"""

import sys
import time

import datasets
import numpy
import torch

import chainiter

WORKERS, BATCH = 2, 64


def main(n=20000, passes=3):
    dataset = datasets.Dataset.from_dict({
        'x': numpy.random.default_rng(0).normal(
            size=(n, 32)).astype(numpy.float32),
        'label': numpy.arange(n) % 10}).with_format('numpy')

    started = time.perf_counter()
    with chainiter.MultiprocessIterator(
            dataset, BATCH, repeat=False, seed=0, n_processes=WORKERS,
            converter=chainiter.concat_examples) as it:
        seen = sum(len(batch['label']) for _ in range(passes)
                   for batch in it.one_epoch())
    ours = seen / (time.perf_counter() - started)

    started = time.perf_counter()
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
        persistent_workers=True)
    seen = sum(len(batch['label']) for _ in range(passes)
               for batch in loader)
    del loader
    theirs = seen / (time.perf_counter() - started)
    print('chainiter {:.0f} examples/s, DataLoader {:.0f} examples/s: '
          '{:.2f}x'.format(ours, theirs, ours / theirs))


if __name__ == '__main__':
    main(*(int(a) for a in sys.argv[1:]))
