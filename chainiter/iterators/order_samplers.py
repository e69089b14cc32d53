"""Order samplers: who decides the order of each epoch.

An order sampler is any callable ``sampler(current_order, current_position)
-> new_order`` (Chainer's protocol).  It is called once when an iterator is
built or reset (with ``numpy.arange(len(dataset))`` and 0) and once at every
epoch boundary.  A sampler with a ``serialize(serializer)`` method has its
state written into the iterator's snapshots.

Without an order sampler, a shuffling iterator uses ``seeded_order``: epoch
``e``'s permutation is a pure function of ``(seed, e)``, so a snapshot only
needs the seed and the epoch, and prefetching never advances hidden RNG state.
"""

import numpy

# Distinct first words of the seed sequences, so that the epoch orders and
# the per-example generators of one seed never share a stream.
_ORDER_STREAM = 0
_EXAMPLE_STREAM = 1
_RESET_STREAM = 2


class OrderSampler:
    """Base class of order samplers (Chainer's protocol)."""

    def __call__(self, current_order, current_position):
        raise NotImplementedError


class ShuffleOrderSampler(OrderSampler):
    """Draws a fresh random permutation at every epoch.

    Args:
        random_state (numpy.random.RandomState or None): the generator to
            draw from.  With ``None`` a private generator is seeded from
            numpy's global RNG at construction, so ``numpy.random.seed(s)``
            before building makes runs repeatable, and nothing else that
            uses the global RNG changes this sampler's orders.

    Its generator state is saved in snapshots.
    """

    def __init__(self, random_state=None):
        if random_state is None:
            random_state = numpy.random.RandomState(
                numpy.random.randint(0, 2 ** 31 - 1))
        self._random = random_state

    def __call__(self, current_order, current_position):
        return self._random.permutation(len(current_order))

    def serialize(self, serializer):
        name, keys, pos, has_gauss, cached = self._random.get_state()
        keys = serializer('keys', keys)
        pos = serializer('pos', pos)
        has_gauss = serializer('has_gauss', has_gauss)
        cached = serializer('cached_gaussian', cached)
        self._random.set_state(
            (name, numpy.asarray(keys, dtype=numpy.uint32), int(pos),
             int(has_gauss), float(cached)))


def draw_seed():
    """A seed drawn from numpy's global RNG (used when ``seed=None``)."""
    return int(numpy.random.randint(0, 2 ** 63 - 1, dtype=numpy.int64))


def check_seed(seed):
    if seed is None:
        return draw_seed()
    if isinstance(seed, (bool, numpy.bool_)) or not isinstance(
            seed, (int, numpy.integer)) or not 0 <= seed < 2 ** 63:
        raise ValueError(
            'seed must be an int in [0, 2**63) or None, got {!r}'.format(seed))
    return int(seed)


def pass_seed(seed, resets):
    """The seed of the pass after the ``resets``-th ``reset()``: ``seed``
    itself before the first, then a pure function of ``(seed, resets)``."""
    if resets == 0:
        return seed
    words = numpy.random.SeedSequence(
        [seed, _RESET_STREAM, resets]).generate_state(2, numpy.uint64)
    return int(words[0]) >> 1


def seeded_order(seed, epoch, n):
    """Epoch ``epoch``'s permutation of ``range(n)`` for ``seed``."""
    rng = numpy.random.Generator(numpy.random.PCG64(
        numpy.random.SeedSequence([seed, _ORDER_STREAM, epoch])))
    return rng.permutation(n)


def example_generator(seed, epoch, position):
    """The generator ``example_rng()`` returns for one example."""
    return numpy.random.Generator(numpy.random.PCG64(
        numpy.random.SeedSequence([seed, _EXAMPLE_STREAM, epoch, position])))
