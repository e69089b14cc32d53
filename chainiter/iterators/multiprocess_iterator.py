"""Chainer's module path (``chainer.iterators.multiprocess_iterator``); the
code lives in ``chainiter/iterators/pipeline/processes/``."""

from chainiter.iterators.pipeline.processes.iterator import (  # NOQA
    MultiprocessIterator)
