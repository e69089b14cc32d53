from chainiter.dataset.dataset_mixin import DatasetMixin


class TransformDataset(DatasetMixin):
    """Example ``i`` is ``transform(dataset[i])``, computed when accessed
    (use ``chainiter.example_rng()`` inside ``transform`` for random
    augmentation that survives resume)."""

    def __init__(self, dataset, transform):
        self._dataset = dataset
        self._transform = transform

    def __len__(self):
        return len(self._dataset)

    def get_example(self, i):
        return self._transform(self._dataset[i])
