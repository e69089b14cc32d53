"""Chainer's ``chainer.dataset``: converters, the iterator base, DatasetMixin."""

from chainiter.dataset.async_transfer import ConcatWithAsyncTransfer  # NOQA
from chainiter.dataset.convert import (  # NOQA
    Converter, concat_examples, converter, to_device)
from chainiter.dataset.dataset_mixin import DatasetMixin  # NOQA
from chainiter.iterators._protocol import Iterator  # NOQA
