"""Order samplers: who decides the order of each epoch.

An order sampler is any callable ``sampler(current_order, current_position)
-> new_order`` (Chainer's protocol).  It is called once when an iterator is
built or reset (with ``numpy.arange(len(dataset))`` and 0) and once at every
epoch boundary.  A sampler with a ``serialize(serializer)`` method has its
state written into the iterator's snapshots.

Without an order sampler, a shuffling iterator uses ``SeededPermutation``:
epoch ``e``'s permutation is a pure function of ``(seed, e)``, so a snapshot
only needs the seed and the epoch, and prefetching never advances hidden RNG
state.  Beyond 65536 examples the permutation is never held as an array: the
index at any position is computed when a batch asks for it (a keyed Feistel
network over the positions; MultiprocessIterator's workers compute the
indices of the batches they load), so memory, snapshots and the epoch
boundary cost the same for a million examples or a billion.
"""

import hashlib
from typing import Any, Optional

import numpy

# Distinct first words of the seed sequences, so that the epoch orders and
# the per-example generators of one seed never share a stream.
_ORDER_STREAM = 0
_EXAMPLE_STREAM = 1
_RESET_STREAM = 2
_RANK_STREAM = 3


class OrderSampler:
    """Base class of order samplers (Chainer's protocol)."""

    def __call__(self, current_order: Any,
                 current_position: int) -> Any:
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

    def __init__(self,
                 random_state: Optional[numpy.random.RandomState] = None
                 ) -> None:
        if random_state is None:
            random_state = numpy.random.RandomState(
                numpy.random.randint(0, 2 ** 31 - 1))
        self._random = random_state

    def __call__(self, current_order: Any,
                 current_position: int) -> numpy.ndarray:
        return self._random.permutation(len(current_order))

    def serialize(self, serializer: Any) -> None:
        name, keys, pos, has_gauss, cached = self._random.get_state()
        keys = serializer('keys', keys)
        pos = serializer('pos', pos)
        has_gauss = serializer('has_gauss', has_gauss)
        cached = serializer('cached_gaussian', cached)
        self._random.set_state(
            (name, numpy.asarray(keys, dtype=numpy.uint32), int(pos),
             int(has_gauss), float(cached)))


def draw_seed():
    """A seed drawn from numpy's global RNG (used when ``seed=None`` and
    the iterator shuffles)."""
    return int(numpy.random.randint(0, 2 ** 63 - 1, dtype=numpy.int64))


def seed_from_global_state():
    """A seed that is a function of the state of numpy's global RNG, which
    is read, not drawn from (used when ``seed=None`` and nothing is
    shuffled: the global RNG is left as Chainer leaves it, and
    ``numpy.random.seed(s)`` still makes ``example_rng()`` repeatable)."""
    _, keys, position = numpy.random.get_state()[:3]
    digest = hashlib.blake2b(keys.tobytes(), digest_size=8,
                             salt=b'chainiter')
    digest.update(int(position).to_bytes(4, 'little'))
    return int.from_bytes(digest.digest(), 'little') >> 1


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


def rank_seed(seed, rank):
    """The seed of rank ``rank``'s worker processes in a sharded run: a
    pure function of ``(seed, rank)``, so that the ranks' workers seed
    numpy's and Python's global generators apart (``example_rng()`` does
    not depend on it)."""
    words = numpy.random.SeedSequence(
        [seed, _RANK_STREAM, rank]).generate_state(2, numpy.uint64)
    return int(words[0]) >> 2


_FEISTEL_ROUNDS = 6
#: Permutations of at most this many positions are drawn whole (numpy's
#: shuffle, exactly uniform, 512 KiB at most): cheaper than the network for
#: small datasets, whose epochs come often.
MATERIALIZED_MAX = 2 ** 16
_MIX1 = numpy.uint64(0xbf58476d1ce4e5b9)
_MIX2 = numpy.uint64(0x94d049bb133111eb)
_S30, _S27, _S31 = numpy.uint64(30), numpy.uint64(27), numpy.uint64(31)


def _mix(z):
    """A 64-bit hash of each element (splitmix64's finaliser), in place."""
    z ^= z >> _S30
    z *= _MIX1
    z ^= z >> _S27
    z *= _MIX2
    z ^= z >> _S31
    return z


class SeededPermutation:
    """Epoch ``epoch``'s permutation of ``range(n)`` for ``seed``, computed
    position by position.

    ``perm[a:b]`` (or ``perm.take(positions)``) gives the dataset indices at
    those positions; ``len(perm)`` is ``n``; ``numpy.asarray(perm)`` makes
    the whole array (only for those who need one, e.g. a snapshot Chainer
    must load).  Above ``MATERIALIZED_MAX`` nothing of size ``n`` is ever
    stored.

    Up to ``MATERIALIZED_MAX`` positions the permutation is numpy's
    (``Generator.permutation``), drawn whole when first read.  Beyond, the
    positions ``0...n-1`` are split as ``x = hi * b + lo`` over a grid of
    ``a * b >= n`` cells (``a = ceil(sqrt(n))``, ``b = ceil(n / a)``), and a
    six-round Feistel network with modular addition, keyed from ``(seed,
    epoch)``, shuffles the grid; the few cells past ``n`` (fewer than ``a``)
    are walked on until they land inside.  Every round is a bijection of the
    grid, so the result is a permutation for every key.

    Batches ask for neighbouring positions, so the indices are computed
    ``block`` positions at a time from the first one asked for, and the last
    block is kept.
    """

    def __init__(self, seed, epoch, n, block=4096):
        self.seed = int(seed)
        self.epoch = int(epoch)
        self.n = int(n)
        self.block = int(block)
        a = max(1, int(numpy.ceil(numpy.sqrt(self.n))))
        while (a - 1) * (a - 1) >= self.n and a > 1:   # float rounding
            a -= 1
        self._radix = (a, max(1, -(-self.n // a)))
        self._keys = numpy.random.SeedSequence(
            [self.seed, _ORDER_STREAM, self.epoch]).generate_state(
                _FEISTEL_ROUNDS, numpy.uint64)
        self._cached = (0, None)      # (first position, indices) of a block

    def __len__(self):
        return self.n

    def __repr__(self):
        return 'SeededPermutation(seed={}, epoch={}, n={})'.format(
            self.seed, self.epoch, self.n)

    def __eq__(self, other):
        return isinstance(other, SeededPermutation) and (
            self.seed, self.epoch, self.n) == (other.seed, other.epoch,
                                               other.n)

    def __hash__(self):
        return hash((self.seed, self.epoch, self.n))

    def __reduce__(self):
        return type(self), (self.seed, self.epoch, self.n, self.block)

    def __array__(self, dtype=None, copy=None):
        whole = self.take(numpy.arange(self.n, dtype=numpy.int64))
        return whole if dtype is None else whole.astype(dtype)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, stride = key.indices(self.n)
            if stride == 1:
                return self._span(start, max(start, stop))
            return self.take(numpy.arange(start, stop, stride))
        if isinstance(key, (int, numpy.integer)):
            position = int(key) + (self.n if key < 0 else 0)
            if not 0 <= position < self.n:
                raise IndexError('position {} is out of range for a '
                                 'permutation of {}'.format(key, self.n))
            return int(self.take(numpy.array([position]))[0])
        return self.take(key)

    def _whole(self):
        """The whole permutation of a small ``n`` (drawn once)."""
        first, cached = self._cached
        if cached is None or first != 0 or len(cached) != self.n:
            cached = numpy.random.Generator(numpy.random.PCG64(
                numpy.random.SeedSequence(
                    [self.seed, _ORDER_STREAM, self.epoch]))).permutation(
                        self.n)
            cached.flags.writeable = False
            self._cached = (0, cached)
        return cached

    def _span(self, start, stop):
        if self.n <= MATERIALIZED_MAX:
            return self._whole()[start:stop]
        first, cached = self._cached
        if cached is not None and first <= start and \
                stop <= first + len(cached):
            return cached[start - first:stop - first]
        if stop - start > self.block:
            return self.take(numpy.arange(start, stop))
        cached = self.take(numpy.arange(start, min(self.n,
                                                   start + self.block)))
        cached.flags.writeable = False
        self._cached = (start, cached)
        return cached[:stop - start]

    def take(self, positions):
        """The indices at ``positions`` (integers in ``[0, n)``)."""
        positions = numpy.asarray(positions)
        if positions.size and (positions.min() < 0 or
                               positions.max() >= self.n):
            raise IndexError('positions must lie in [0, {})'.format(self.n))
        if self.n <= MATERIALIZED_MAX:
            return self._whole()[positions]
        x = self._shuffle_grid(positions.astype(numpy.uint64).ravel())
        n = numpy.uint64(self.n)
        outside = numpy.flatnonzero(x >= n)
        while outside.size:       # walk the cells past n back inside
            x[outside] = self._shuffle_grid(x[outside])
            outside = outside[x[outside] >= n]
        return x.astype(numpy.intp).reshape(positions.shape)

    def _shuffle_grid(self, x):
        a, b = (numpy.uint64(r) for r in self._radix)
        # x = hi * b + lo, hi in [0, a), lo in [0, b); each round maps
        # (hi, lo) to (lo, (hi + F(lo)) mod a) and the radices swap.
        # numpy divides by a scalar fast (floor_divide) but takes the
        # remainder slowly: remainders are x - (x // b) * b, and the sum
        # of two numbers below a is brought below a by one subtraction.
        mixed = numpy.empty_like(x)
        lo = numpy.empty_like(x)
        below = numpy.empty_like(x)
        for key in self._keys:
            hi = x // b
            numpy.multiply(hi, b, out=lo)
            numpy.subtract(x, lo, out=lo)
            numpy.bitwise_xor(lo, key, out=mixed)
            _mix(mixed)
            numpy.floor_divide(mixed, a, out=below)
            below *= a
            mixed -= below                  # F(lo) mod a
            mixed += hi
            # Below a already, or (wrapping) a huge number otherwise.
            numpy.subtract(mixed, a, out=below)
            numpy.minimum(mixed, below, out=mixed)
            lo *= a
            lo += mixed
            x, lo = lo, x
            a, b = b, a
        return x


def seeded_order(seed, epoch, n):
    """Epoch ``epoch``'s permutation of ``range(n)`` for ``seed``, as an
    array (``SeededPermutation`` computes any part of it without one)."""
    return numpy.asarray(SeededPermutation(seed, epoch, n))


def example_generator(seed, epoch, position):
    """The generator ``example_rng()`` returns for one example."""
    return numpy.random.Generator(numpy.random.PCG64(
        numpy.random.SeedSequence([seed, _EXAMPLE_STREAM, epoch, position])))
