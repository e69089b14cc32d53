"""Data-parallel training over many processes and machines.

Two ways, both launched by ``mpiexec``/``mpirun``, ``torchrun`` or ``srun``:

- The sharded iterator (no data shipped): every rank builds the same
  dataset and passes ``shard=`` to any chainiter iterator::

      it = chainiter.MultiprocessIterator(dataset, 64, seed=0,
                                          shard=(rank, size))

  Each step takes one global batch of ``size * 64`` examples from the one
  seed-derived order over the whole dataset, and rank ``r`` loads rows
  ``64 * r ... 64 * r + 63`` of it.  ``shard='auto'`` reads rank and size
  from the launcher's environment; ``shard=comm`` (an mpi4py communicator,
  e.g. ``world()``) takes them from it, and one allgather (the only
  message) checks that the ranks agree on the seed, batch size and dataset
  length (a ``ValueError`` on every rank where not) and gives them rank 0's
  seed where all passed ``seed=None``.  Snapshots hold the global
  position and load on any number of ranks (``chainiter.iterators._shard``
  states the promises).
- ChainerMN's API: ``scatter_dataset``, ``scatter_index`` and
  ``create_synchronized_iterator``, working as ChainerMN's.

mpi4py is imported by ``world()`` alone (module ``_mpi``).
"""

from chainiter.distributed._mpi import world  # NOQA
from chainiter.distributed.scatter import (  # NOQA
    scatter_dataset, scatter_index, share_bounds)
from chainiter.distributed.synchronized import (  # NOQA
    create_synchronized_iterator)
from chainiter.iterators._shard import (  # NOQA
    LAUNCHER_VARIABLES, Shard, from_environment)
