from typing import Any, Callable, Optional, Tuple, Union

from chainiter.iterators._base import DatasetIterator


class SerialIterator(DatasetIterator):
    """Loads each batch in the calling thread when ``next()`` is called.

    Args:
        dataset: anything with ``__len__`` and ``__getitem__``.
        batch_size (int): examples per batch.
        repeat (bool): wrap around into further epochs; with False the last
            batch may be short and then ``StopIteration`` is raised.
        shuffle (bool or None): shuffle the order every epoch (None: shuffle
            unless ``order_sampler`` is given).
        order_sampler: a callable ``(current_order, current_position) ->
            new_order``; cannot be combined with ``shuffle``.
        seed (int or None): with shuffling and no order sampler, epoch ``e``'s
            order is a pure function of ``(seed, e)``; also keys
            ``example_rng()``.  None draws it from numpy's global RNG
            (without a shuffle, reads it from that RNG's state: nothing is
            drawn).
        shard: load one rank's share of every batch of a data-parallel run:
            ``(rank, size)``, ``'auto'`` (from the launcher's environment:
            mpiexec, mpirun, torchrun, srun) or an mpi4py communicator.
            The iterator steps through one global order by ``size *
            batch_size`` examples and hands out this rank's ``batch_size``
            of them; ``epoch``, ``current_position`` and snapshots are the
            global ones.  With ``seed=None`` a communicator sends rank 0's
            seed to the others; otherwise pass the same seed on every
            rank.  See ``chainiter.distributed``.
    """

    def __init__(self, dataset: Any, batch_size: int, repeat: bool = True,
                 shuffle: Optional[bool] = None,
                 order_sampler: Optional[Callable[[Any, int], Any]] = None,
                 *, seed: Optional[int] = None,
                 shard: Union[Tuple[int, int], str, Any, None] = None
                 ) -> None:
        super().__init__(dataset, batch_size, repeat, shuffle, order_sampler,
                         seed, shard)
