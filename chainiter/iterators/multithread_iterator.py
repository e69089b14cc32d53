"""Chainer's module path (``chainer.iterators.multithread_iterator``); the
code lives in ``chainiter/iterators/pipeline/threads/``."""

from chainiter.iterators.pipeline.threads.iterator import (  # NOQA
    MultithreadIterator)
