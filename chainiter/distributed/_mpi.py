"""The one module that imports mpi4py, lazily (extra ``mpi``): importing
chainiter never starts MPI."""

from typing import Any

available = None
import_error = None


def world() -> Any:
    """``mpi4py.MPI.COMM_WORLD``: imports mpi4py (which starts MPI) on the
    first call, with a message that says how to install it when missing."""
    global available, import_error
    try:
        from mpi4py import MPI
    except ImportError as e:
        available, import_error = False, e
        raise ImportError(
            'chainiter.distributed.world() needs mpi4py and an MPI library: '
            'pip install "chainiter[mpi]" (mpi4py), and mpich or Open MPI '
            '(pip install mpich); or pass shard=(rank, size) or '
            "shard='auto' with seed=, which need no MPI ({})".format(
                e)) from e
    available = True
    return MPI.COMM_WORLD
