"""Iterators over datasets (Chainer's ``chainer.iterators``)."""

from chainiter.iterators._protocol import Iterator  # NOQA
from chainiter.iterators.multithread_iterator import MultithreadIterator  # NOQA
from chainiter.iterators.order_samplers import (  # NOQA
    OrderSampler, ShuffleOrderSampler)
from chainiter.iterators.serial_iterator import SerialIterator  # NOQA
from chainiter.iterators.multiprocess_iterator import (  # NOQA
    MultiprocessIterator)
from chainiter.iterators.device_prefetcher import DevicePrefetcher  # NOQA
from chainiter.iterators.loader import Loader  # NOQA
