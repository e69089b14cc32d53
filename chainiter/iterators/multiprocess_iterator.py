"""Chainer's module path (``chainer.iterators.multiprocess_iterator``); the
code lives in ``chainiter/iterators/multiprocess/``."""

from chainiter.iterators.multiprocess import MultiprocessIterator  # NOQA
