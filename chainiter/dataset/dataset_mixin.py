from typing import Any

import numpy


class DatasetMixin:
    """Chainer's ``DatasetMixin``: define ``__len__`` and
    ``get_example(i)``; indexing with an int, a slice, a list or an int
    array is provided."""

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self.get_example(i)
                    for i in range(*index.indices(len(self)))]
        if isinstance(index, (list, numpy.ndarray)):
            return [self.get_example(int(i)) for i in index]
        return self.get_example(index)

    def __len__(self) -> int:
        raise NotImplementedError

    def get_example(self, i: int) -> Any:
        raise NotImplementedError
