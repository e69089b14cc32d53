"""ChainerMN's ``create_synchronized_iterator``: the same batches on every
rank (model parallelism: every rank must see the same examples)."""

from typing import Any, TypeVar

import numpy

from chainiter.distributed import _comm
from chainiter.iterators import order_samplers


_It = TypeVar('_It')


def create_synchronized_iterator(actual_iterator: _It, comm: Any) -> _It:
    """Make ``actual_iterator`` give the same batches on every rank of
    ``comm``; returns it.

    Rank 0's seed is sent to every rank (one broadcast) and the iterator
    starts over from it, as ChainerMN's does.  A chainiter iterator keeps
    its kind of order: a seeded shuffle takes rank 0's seed (so a seed the
    user gave on rank 0 holds, and ``example_rng()`` agrees across ranks
    too); one that does not shuffle stays unshuffled (ChainerMN's starts
    shuffling); an order sampler is replaced by a ``ShuffleOrderSampler``
    seeded from it, as in ChainerMN.  Any other iterator with an
    ``order_sampler`` attribute (Chainer's) gets that sampler and a
    ``reset()``.
    """
    if not hasattr(actual_iterator, 'order_sampler'):
        raise ValueError(
            'actual_iterator must have order_sampler (a Chainer or '
            'chainiter iterator), got {!r}'.format(
                type(actual_iterator).__name__))
    rank, _ = _comm.rank_size(comm)
    mine = getattr(actual_iterator, 'seed', None)
    if not isinstance(mine, int):
        mine = order_samplers.draw_seed()
    seed = int(_comm.bcast_small(comm, mine if rank == 0 else None))
    restart = getattr(actual_iterator, '_synchronize', None)
    if actual_iterator.order_sampler is not None or restart is None:
        actual_iterator.order_sampler = order_samplers.ShuffleOrderSampler(
            numpy.random.RandomState(seed % 2 ** 32))
    if restart is not None:
        restart(seed)
    else:
        actual_iterator.reset()  # type: ignore[attr-defined]
    return actual_iterator
