"""ChainerMN's ``scatter_dataset`` and ``scatter_index``: rank ``root``'s
dataset is sent to every rank, and each keeps a contiguous share of it
(of its shuffled order with ``shuffle=True``)."""

from typing import Any, List, Optional, Tuple

import numpy

from chainiter.datasets import SubDataset
from chainiter.distributed import _comm


def share_bounds(n_total: int, size: int, force_equal_length: bool = True
                 ) -> List[Tuple[int, int]]:
    """``[(begin, end)]`` of each rank's share of ``n_total`` indices, as
    ChainerMN splits them.

    With ``force_equal_length`` every share is ``ceil(n_total / size)``
    long, starting at ``n_total * rank // size``: where ``size`` does not
    divide ``n_total``, neighbouring shares overlap (some examples are in
    two shares), and no share runs past the end.  Without it the shares
    are disjoint and their lengths differ by at most one (the first
    ``n_total % size`` ranks get one more).
    """
    if force_equal_length:
        each = -(-n_total // size)
        return [(n_total * i // size, n_total * i // size + each)
                for i in range(size)]
    bounds, begin = [], 0
    for i in range(size):
        end = begin + n_total // size + (1 if i < n_total % size else 0)
        bounds.append((begin, end))
        begin = end
    return bounds


def scatter_index(n_total_indices: int, comm: Any, root: int = 0, *,
                  force_equal_length: bool = True) -> Tuple[int, int]:
    """``(begin, end)`` of this rank's share of ``range(n_total_indices)``
    (the root's number counts): ChainerMN's ``scatter_index``, for a dataset
    every rank can open itself.

    Args:
        n_total_indices (int): how many indices to share out (read on
            ``root`` only).
        comm: an mpi4py or ChainerMN communicator.
        root (int): the rank whose ``n_total_indices`` counts.
        force_equal_length (bool): every share as long (overlapping
            neighbours fill the short ones, so some indices are in two
            shares: what a data-parallel updater needs); False: disjoint
            shares whose lengths differ by at most one (an exact
            evaluation).
    """
    rank, size = _comm.rank_size(comm)
    root = _comm.check_root(comm, root)
    n = None
    if rank == root:
        if isinstance(n_total_indices, bool) or not isinstance(
                n_total_indices, (int, numpy.integer)) or \
                n_total_indices < 0:
            raise ValueError(
                'n_total_indices must be an int >= 0, got {!r}'.format(
                    n_total_indices))
        n = int(n_total_indices)
    n = _comm.bcast_small(comm, n, root=root)
    return share_bounds(n, size, force_equal_length)[rank]


def scatter_dataset(dataset: Any, comm: Any, root: int = 0,
                    shuffle: bool = False, seed: Optional[int] = None,
                    max_buf_len: int = 256 * 1024 * 1024, *,
                    force_equal_length: bool = True) -> SubDataset:
    """Send rank ``root``'s dataset to every rank; return this rank's share
    as a ``SubDataset`` (ChainerMN's ``scatter_dataset``).

    The other ranks' ``dataset`` is ignored (pass None).  With ``shuffle``
    the dataset is split along a permutation drawn from
    ``numpy.random.RandomState(seed)`` on the root, so a fixed seed puts
    each example in the same share every time.  The dataset travels pickled,
    in pieces of at most ``max_buf_len`` bytes.  ``force_equal_length`` as
    for ``scatter_index``.

    This ships the whole dataset from the root: for a dataset every rank can
    build or open itself, a sharded iterator (``shard=`` on any chainiter
    iterator) ships nothing and reshuffles across ranks every epoch.
    """
    rank, _ = _comm.rank_size(comm)
    root = _comm.check_root(comm, root)
    payload = None
    if rank == root:
        order = None
        if shuffle:
            order = numpy.random.RandomState(seed).permutation(len(dataset))
        payload = (dataset, order)
    dataset, order = _comm.bcast_obj(comm, payload, root=root,
                                     max_buf_len=max_buf_len)
    begin, end = scatter_index(len(dataset), comm, root,
                               force_equal_length=force_equal_length)
    return SubDataset(dataset, begin, end, order)
