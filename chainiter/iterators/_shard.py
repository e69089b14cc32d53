"""Sharding: which rank this is (``resolve``: the ``shard=`` argument, the
launcher's environment, a communicator) and, pure, which rows of each global
batch one rank loads.

::

    every rank:  state ── advance(state, size * batch_size) ──► global Step
                                                                   │
    rank r:      rows [r * batch_size, (r + 1) * batch_size) ◄── shard_step
                 (Step.cut: the rows' spans and orders; example_rng()
                  keys stay the global (epoch, position))

Every rank keeps the same state (the global position: examples consumed by
all ranks together) and advances it by the global batch ``size *
batch_size`` with the pure ``advance``; a rank then keeps its rows of each
global step.  Nothing is communicated: the ranks agree because the order is
a pure function of ``(seed, epoch)``.

The remainder ``n % (size * batch_size)`` of an epoch of ``n`` examples:

- ``repeat=True``: as in Chainer, the last global batch of an epoch is filled
  up from the next epoch's order, so every global batch is full and every
  rank gets ``batch_size`` rows each step.  Epoch ``e``'s examples are dealt
  out exactly once over the ranks.
- ``repeat=False``: the last global batch has ``m`` examples, ``0 < m <=
  size * batch_size``; each rank gets ``ceil(m / size)`` rows (the same
  count on every rank, so no rank waits for another in an allreduce), and
  the ``size * ceil(m / size) - m`` rows missing (fewer than ``size``) are
  taken from the start of the same epoch's order, wrapping around, as
  PyTorch's DistributedSampler pads.  Those are the only examples any rank
  sees twice in an epoch; they are the last rows of the last ranks' last
  batches (the iterator's ``padding`` counts them).

Changing the global batch (another number of ranks or another batch size)
changes nothing but where the cuts fall: the stream of (epoch, position) is
the same, so a run resumed from a snapshot at global position ``p``
continues with the examples at ``p, p + 1, ...`` of the uninterrupted run.
"""

import os
import typing
from typing import Mapping, Optional
import warnings

import numpy

from chainiter.iterators import _args, _state


class Shard(typing.NamedTuple):
    """This process is rank ``rank`` of ``size``."""
    rank: int
    size: int


#: Launchers' variables, in the order they are looked for: Open MPI's
#: mpirun, MPICH's and Intel MPI's mpiexec (Hydra, PMI), torchrun, Slurm's
#: srun (a task of a job step: the step's number of tasks, not the job's
#: SLURM_NTASKS, see ``_slurm_outside_a_step``).
LAUNCHER_VARIABLES = (
    ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'),
    ('PMI_RANK', 'PMI_SIZE'),
    ('RANK', 'WORLD_SIZE'),
    ('SLURM_PROCID', 'SLURM_STEP_NUM_TASKS'),
)

#: Slurm numbers the steps an srun launches from 0; the ids from this one
#: up name its special steps (batch script, extern, interactive), whose
#: one process is no rank (``SLURM_MAX_NORMAL_STEP_ID`` in slurm.h).
_SLURM_SPECIAL_STEPS = 0xfffffff0


def check_shard(rank, size):
    """``Shard(rank, size)`` of two valid ints, or a ``ValueError``."""
    size = _args.positive_int('the shard size (number of ranks)', size)
    if isinstance(rank, (bool, numpy.bool_)) or not isinstance(
            rank, (int, numpy.integer)) or not 0 <= rank < size:
        raise ValueError(
            'the rank must be an int in [0, {}) for {} ranks, got '
            '{!r}'.format(size, size, rank))
    return Shard(int(rank), size)


def _slurm_outside_a_step(environ):
    """Whether Slurm's ``SLURM_PROCID`` belongs to no task of an srun step:
    a batch script (``#SBATCH --ntasks=4`` and a plain ``python train.py``
    has ``SLURM_PROCID=0`` and ``SLURM_NTASKS=4``, but is one process), or
    the extern or interactive step.  Slurm sets ``SLURM_STEP_NUM_TASKS``
    for the tasks of a step alone; a ``SLURM_STEP_ID`` other than a step's
    number (``-5`` or ``4294967291`` for the batch step where a release sets
    it) wins over one inherited from sbatch's caller."""
    step = environ.get('SLURM_STEP_ID')
    if step is not None:
        try:
            number = int(step)
        except ValueError:      # a name ('batch', 'extern')
            return True
        if not 0 <= number < _SLURM_SPECIAL_STEPS:
            return True
    return environ.get('SLURM_STEP_NUM_TASKS') is None


def _slurm_batch_script(environ):
    """``Shard(0, 1)`` for Slurm's batch script (or another special step),
    with a warning where the job has more than one task: ranks were
    probably meant, and srun starts them."""
    procid, tasks = environ.get('SLURM_PROCID'), environ.get('SLURM_NTASKS')
    if procid is not None and procid.strip() != '0':
        raise ValueError(
            'the environment sets SLURM_PROCID={!r} but not '
            'SLURM_STEP_NUM_TASKS (or a SLURM_STEP_ID={!r} of no srun '
            'step): only the tasks of an srun step are ranks, and Slurm '
            'sets both for them. Launch the ranks with srun, or pass '
            'shard=(rank, size) instead'.format(
                procid, environ.get('SLURM_STEP_ID')))
    try:
        many = tasks is not None and int(tasks) > 1
    except ValueError:
        many = False
    if many:
        warnings.warn(
            'the environment has SLURM_NTASKS={!r} outside an srun step '
            '(SLURM_STEP_ID={!r}): this process is a Slurm batch script '
            '(or salloc\'s shell), not a task of a step, so it is one '
            'process and loads every example (shard (0, 1)), not rank 0 of '
            '{}. To run {} ranks, start them with srun (srun python '
            'train.py), or pass shard=(rank, size)'.format(
                tasks, environ.get('SLURM_STEP_ID'), tasks, tasks),
            UserWarning,
            stacklevel=3)
    return Shard(0, 1)


def from_environment(environ: Optional[Mapping[str, str]] = None) -> Shard:
    """``Shard(rank, size)`` from the launcher's environment variables
    (``LAUNCHER_VARIABLES``), or ``Shard(0, 1)`` where none is set (a plain
    ``python train.py``) or where Slurm's are those of a batch script, not
    of an srun step's task (with a warning where the job has many
    tasks)."""
    environ = os.environ if environ is None else environ
    for rank_name, size_name in LAUNCHER_VARIABLES:
        if rank_name == 'SLURM_PROCID' and any(
                name in environ for name in (rank_name, size_name,
                                             'SLURM_NTASKS')) and \
                _slurm_outside_a_step(environ):
            return _slurm_batch_script(environ)
        rank, size = environ.get(rank_name), environ.get(size_name)
        if rank is None and size is None:
            continue
        if rank is None or size is None:
            raise ValueError(
                'the environment sets {}={!r} but not {}; the launcher '
                'sets both. Pass shard=(rank, size) instead'.format(
                    *((rank_name, rank, size_name) if size is None else
                      (size_name, size, rank_name))))
        try:
            return check_shard(int(rank), int(size))
        except ValueError as e:
            raise ValueError(
                'the environment says {}={!r}, {}={!r}: {}'.format(
                    rank_name, rank, size_name, size, e)) from None
    return Shard(0, 1)


def resolve(shard, seed, drawn, same):
    """``(Shard, seed)`` for the ``shard=`` argument: ``(rank, size)``,
    ``'auto'`` (the launcher's environment variables) or a communicator,
    whose ranks check in one message that they agree on the seed and on
    ``same`` (``(name, value)`` pairs: batch size, dataset length...), and
    take rank 0's seed where none was given (``agree``).  Without a
    communicator there is no one to ask."""
    if isinstance(shard, str):
        if shard != 'auto':
            raise ValueError(
                "shard must be (rank, size), 'auto' or a communicator, got "
                "{!r}".format(shard))
        where = from_environment()
    elif isinstance(shard, (tuple, list)):
        if len(shard) != 2:
            raise ValueError(
                'shard=(rank, size) takes two ints, got {!r}'.format(shard))
        where = check_shard(*shard)
    else:
        from chainiter.distributed import _comm   # never imports mpi4py
        if not _comm.is_communicator(shard):
            raise TypeError(
                "shard must be (rank, size), 'auto' or an mpi4py or ChainerMN "
                "communicator, got {!r}".format(shard))
        where = check_shard(*_comm.rank_size(shard))
        if where.size > 1:
            drawn = agree(shard, seed is not None, drawn, same)
        return where, drawn
    if seed is None and where.size > 1:
        raise ValueError(
            'a sharded iterator needs the same seed on every rank: pass '
            'seed= (the same int on every rank), or shard=comm (an mpi4py '
            'communicator) so that rank 0\'s seed is sent to the others; '
            'got seed=None with shard={!r} (rank {} of {})'.format(
                shard, where.rank, where.size))
    return where, drawn


def agree(comm, given, seed, same):
    """The seed of every rank of ``comm``: its own where every rank passed
    the same, rank 0's where none passed one.  One allgather of ``(given,
    seed, *values)``; where the ranks differ (``seed=1234 + rank``, another
    batch size or dataset), their shares of the global order would overlap
    or leave examples out, so every rank raises the same ``ValueError``,
    naming each rank's values."""
    from chainiter.distributed import _comm   # never imports mpi4py
    rows = _comm.allgather_small(
        comm, (given, seed) + tuple(value for _, value in same))
    seeds = [row[1] if row[0] else None for row in rows]
    differ = []
    seeds_differ = len(set(seeds)) > 1
    if seeds_differ:
        differ.append('seed ({})'.format(per_rank(seeds)))
    for i, (name, _) in enumerate(same):
        values = [row[2 + i] for row in rows]
        if len(set(values)) > 1:
            differ.append('{} ({})'.format(name, per_rank(values)))
    if differ:
        raise ValueError(
            'the ranks of a sharded iterator take their shares of one global '
            'order, so they need the same seed, batch size and dataset, but '
            'these differ: {}. Pass the same values on every rank{}'.format(
                ', '.join(differ), '' if not seeds_differ else
                ' (or seed=None on all: rank 0\'s seed is sent); no rank '
                'needs a seed of its own, since example_rng() differs per '
                'example and each rank\'s workers seed their generators '
                'apart'))
    return int(rows[0][1])


def per_rank(values, shown=6):
    """``'4 on ranks 0, 1; 5 on rank 2'``: each value and its ranks."""
    groups = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)
    parts = []
    for value, ranks in list(groups.items())[:shown]:
        text = ', '.join(str(r) for r in ranks[:4])
        if len(ranks) > 4:
            text += ', ... ({} ranks)'.format(len(ranks))
        parts.append('{!r} on rank{} {}'.format(
            value, 's' if len(ranks) > 1 else '', text))
    if len(groups) > shown:
        parts.append('{} more values'.format(len(groups) - shown))
    return '; '.join(parts)


def share(rows, size):
    """Rows each rank loads of a global step of ``rows`` rows."""
    return -(-rows // size)


def padding_rows(rows, shard, share_rows):
    """How many of this rank's rows of a global step of ``rows`` rows (each
    rank loading ``share_rows``) repeat an example from the epoch's start."""
    lo = shard.rank * share_rows
    return max(0, min(share_rows, lo + share_rows - rows))


def shard_step(step, shard, order, epoch_size):
    """Rank ``shard.rank``'s part of the global ``step``.

    Args:
        step: the ``Step`` of a global batch (``advance`` with ``shard.size
            * batch_size``).
        shard: ``Shard(rank, size)``.
        order: the order of the epoch the step was taken from (the state's
            order before ``advance``; ``None`` for the identity order): the
            padding of a short last step comes from its start.
        epoch_size: the epoch's length (``len(order)``, or the dataset's).

    Returns:
        ``(local_step, padding)``: the rank's ``Step`` (``ceil(len(step) /
        size)`` rows, keyed by their global epoch and position) and how many
        of its last rows are padding.
    """
    rows = len(step)
    each = share(rows, shard.size)
    missing = each * shard.size - rows
    if missing:     # a short last step (repeat=False): pad from the start
        epoch = step.spans[-1][0]
        full, rest = divmod(missing, epoch_size)
        pad = ((epoch, 0, epoch_size),) * full + (
            ((epoch, 0, rest),) if rest else ())
        if step.orders is None:
            positions = numpy.arange(missing, dtype=numpy.int64) % epoch_size
            extra = positions if order is None else order.take(positions)
            step = _state.Step(numpy.concatenate(
                [step.indices, numpy.asarray(extra, dtype=numpy.intp)]),
                step.spans + pad)
        else:
            step = _state.Step(None, step.spans + pad,
                               step.orders + (order,) * len(pad))
    lo = shard.rank * each
    local = step.cut(lo, lo + each)
    return local, padding_rows(rows, shard, each)
