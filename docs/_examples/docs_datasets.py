"""Datasets for the documentation's examples.

They live in a module (docs/conf.py puts this folder on ``sys.path``) so
that workers started by spawn or forkserver can import them by name.
"""

import numpy

import chainiter


class NoisyImages:
    """``n`` images of 4 values, each with noise drawn from
    ``chainiter.example_rng()``: the same noise after a resume."""

    def __init__(self, n):
        self.images = numpy.arange(n * 4, dtype=numpy.float32).reshape(n, 4)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        noise = chainiter.example_rng().normal(size=4).astype(numpy.float32)
        return self.images[i] + noise, i % 10


class Squares:
    """``(x, x * x)`` for ``x`` in ``0 ... n - 1``, with a batch method
    that computes a whole chunk with one numpy call."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = numpy.float32(i)
        return x, x * x

    def get_examples(self, indices):
        x = numpy.asarray(indices, dtype=numpy.float32)
        return list(zip(x, x * x))
