"""Dataset wrappers (Chainer's ``chainer.datasets``)."""

from chainiter.datasets.concatenated_dataset import ConcatenatedDataset  # NOQA
from chainiter.datasets.dict_dataset import DictDataset  # NOQA
from chainiter.datasets.sub_dataset import (  # NOQA
    SubDataset, get_cross_validation_datasets,
    get_cross_validation_datasets_random, split_dataset, split_dataset_n,
    split_dataset_n_random, split_dataset_random)
from chainiter.datasets.transform_dataset import TransformDataset  # NOQA
from chainiter.datasets.tuple_dataset import TupleDataset  # NOQA
