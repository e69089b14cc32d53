from typing import Any, Callable

from chainiter.dataset.dataset_mixin import DatasetMixin


class TransformDataset(DatasetMixin):
    """Example ``i`` is ``transform(dataset[i])``, computed when accessed
    (use ``chainiter.example_rng()`` inside ``transform`` for random
    augmentation that survives resume)."""

    def __init__(self, dataset: Any,
                 transform: Callable[[Any], Any]) -> None:
        self._dataset = dataset
        self._transform = transform

    def __len__(self) -> int:
        return len(self._dataset)

    def get_example(self, i: int) -> Any:
        return self._transform(self._dataset[i])
