"""chainiter: data-loading iterators for training loops, Chainer-compatible,
that resume exactly from a snapshot."""

from chainiter import datasets  # NOQA
from chainiter import iterators  # NOQA
from chainiter import serializers  # NOQA
from chainiter._context import (  # NOQA
    example_rng, example_rngs, get_worker_info)
from chainiter.dataset.async_transfer import ConcatWithAsyncTransfer  # NOQA
from chainiter.dataset.convert import (  # NOQA
    Converter, concat_examples, converter, to_device)
from chainiter.errors import (  # NOQA
    ChainiterError, IteratorFinalizedError, SharedMemoryWarning,
    SnapshotMismatchError, TimeoutWarning, WorkerDiedError,
    WorkerRestartWarning)
from chainiter.iterators._stats import diagnose  # NOQA
from chainiter.iterators.pipeline.processes.shared_arrays import (  # NOQA
    shared_copy, shared_empty)
from chainiter.iterators import (  # NOQA
    DevicePrefetcher, Iterator, Loader, MultiprocessIterator, MultithreadIterator, OrderSampler,
    SerialIterator,
    ShuffleOrderSampler)
from chainiter import distributed  # NOQA  (mpi4py only on world())

from chainiter import _chainer_compat

_chainer_compat.install()   # Chainer's trainer takes chainiter iterators

__version__ = '0.1.0'
