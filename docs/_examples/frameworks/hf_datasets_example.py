"""A HuggingFace datasets.Dataset as it is: chainiter asks it for whole
chunks (its __getitems__), and the workers stack the batch."""

import datasets
import numpy

import chainiter


def main():
    # [hf]
    n = 1000
    dataset = datasets.Dataset.from_dict({
        'x': numpy.arange(n * 3, dtype=numpy.float32).reshape(n, 3),
        'label': numpy.arange(n) % 10,
    }).with_format('numpy')                  # examples of numpy values
    it = chainiter.MultiprocessIterator(
        dataset, batch_size=32, n_processes=2, seed=0,
        converter=chainiter.concat_examples)
    with it:
        batch = next(it)                      # a dict of stacked arrays
        print({key: (value.shape, value.dtype.name)
               for key, value in batch.items()})
        loader = it.loader()                  # an epoch per iter()
        print(len(loader), 'batches in epoch', it.epoch)
    # [/hf]


if __name__ == '__main__':
    main()
