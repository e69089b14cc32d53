"""What chainiter asks of a communicator, for mpi4py's and ChainerMN's
alike (duck-typed: nothing here imports mpi4py).

- mpi4py (``MPI.COMM_WORLD`` or any ``MPI.Comm``): ``Get_rank()``,
  ``Get_size()``, ``bcast(obj, root=)``, ``Bcast(buffer, root=)``,
  ``allgather(obj)``.
- ChainerMN (``chainermn.create_communicator()``): ``rank``, ``size``,
  ``bcast_obj(obj, max_buf_len=, root=)``, and ``mpi_comm`` (its mpi4py
  communicator) or else ``gather_obj(obj, root=)``.
"""

import pickle

import numpy


def is_communicator(obj):
    return hasattr(obj, 'bcast_obj') or (
        hasattr(obj, 'bcast') and hasattr(obj, 'Get_rank'))


def check_communicator(comm):
    if not is_communicator(comm):
        raise TypeError(
            'comm must be an mpi4py communicator (e.g. '
            'mpi4py.MPI.COMM_WORLD, or chainiter.distributed.world()) or a '
            'ChainerMN communicator, got {!r}'.format(comm))
    return comm


def rank_size(comm):
    """``(rank, size)`` of ``comm``."""
    check_communicator(comm)
    if hasattr(comm, 'Get_rank'):
        return int(comm.Get_rank()), int(comm.Get_size())
    return int(comm.rank), int(comm.size)


def check_root(comm, root):
    _, size = rank_size(comm)
    if isinstance(root, bool) or not isinstance(
            root, (int, numpy.integer)) or not 0 <= root < size:
        raise ValueError('root must be a rank in [0, {}), got {!r}'.format(
            size, root))
    return int(root)


def bcast_small(comm, obj, root=0):
    """``obj`` of rank ``root`` on every rank, in one message (a seed, a
    length)."""
    if hasattr(comm, 'bcast_obj'):      # ChainerMN
        return comm.bcast_obj(obj, root=root)
    return comm.bcast(obj, root=root)


def allgather_small(comm, obj):
    """Every rank's ``obj``, in rank order, on every rank: one collective
    (a few numbers each); two, a gather and a broadcast, with a ChainerMN
    communicator that has no ``mpi_comm``."""
    if hasattr(comm, 'bcast_obj'):      # ChainerMN
        inner = getattr(comm, 'mpi_comm', None)
        if inner is not None:
            return list(inner.allgather(obj))
        return list(comm.bcast_obj(comm.gather_obj(obj, root=0), root=0))
    return list(comm.allgather(obj))


def bcast_obj(comm, obj, root=0, max_buf_len=256 * 1024 * 1024):
    """``obj`` of rank ``root`` on every rank.  With mpi4py the pickle
    travels in pieces of at most ``max_buf_len`` bytes, so objects past
    MPI's 2 GiB message limit go too (as ChainerMN's ``bcast_obj``)."""
    if not 0 < max_buf_len <= 2 ** 31 - 1:
        raise ValueError(
            'max_buf_len must be in [1, 2147483647] bytes, got {!r}'.format(
                max_buf_len))
    if hasattr(comm, 'bcast_obj'):      # ChainerMN
        return comm.bcast_obj(obj, max_buf_len=max_buf_len, root=root)
    rank, _ = rank_size(comm)
    data = None
    if rank == root:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    length = comm.bcast(None if data is None else len(data), root=root)
    if length <= max_buf_len:
        return comm.bcast(obj if rank == root else None, root=root)
    buffer = numpy.frombuffer(bytearray(data), dtype=numpy.uint8) if rank == root \
        else numpy.empty(length, dtype=numpy.uint8)
    for start in range(0, length, max_buf_len):
        comm.Bcast(buffer[start:start + max_buf_len], root=root)
    return obj if rank == root else pickle.loads(buffer.tobytes())
