"""Every exception and warning chainiter raises.

Hierarchy::

    ChainiterError                       base of every chainiter error
    ├── IteratorFinalizedError           next()/reset() after finalize()   (also RuntimeError)
    ├── WorkerDiedError                  a worker process died for good    (also RuntimeError)
    └── SnapshotMismatchError            a snapshot does not fit this iterator,
                                         or is not a snapshot at all       (also ValueError)

    TimeoutWarning        (RuntimeWarning)  no batch arrived for dataset_timeout seconds
    WorkerRestartWarning  (RuntimeWarning)  a dead worker was replaced
    SharedMemoryWarning   (UserWarning)     an example outgrew its shared buffer, the
                                            buffers could not be placed in /dev/shm, or
                                            CUDA could not page-lock them

"You closed it" (``IteratorFinalizedError``) is kept apart from "it broke"
(``WorkerDiedError``) so that a trainer can tell a shutdown from a failure.
Warnings are classes, so ``warnings.simplefilter('error', TimeoutWarning)`` works.
"""

__all__ = [
    'ChainiterError',
    'IteratorFinalizedError',
    'SharedMemoryWarning',
    'SnapshotMismatchError',
    'TimeoutWarning',
    'WorkerDiedError',
    'WorkerRestartWarning',
]


class ChainiterError(Exception):
    """Base class of every error raised by chainiter itself."""


class IteratorFinalizedError(ChainiterError, RuntimeError):
    """The iterator was used after ``finalize()`` (or after leaving ``with``)."""


class WorkerDiedError(ChainiterError, RuntimeError):
    """A worker process died repeatedly on the same batch."""


class SnapshotMismatchError(ChainiterError, ValueError):
    """A snapshot cannot be loaded: it was written for another dataset or
    iterator configuration, or the file is not a readable snapshot."""


class TimeoutWarning(RuntimeWarning):
    """No batch arrived within ``dataset_timeout`` seconds."""


class WorkerRestartWarning(RuntimeWarning):
    """A worker process died and was replaced; its work is redone."""


class SharedMemoryWarning(UserWarning):
    """An example did not fit its shared-memory buffer, the buffers could
    not be placed in ``/dev/shm``, or CUDA could not page-lock them for
    direct copies to the GPU."""
