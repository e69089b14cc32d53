"""The public API used as users use it, for the type checker (not collected
by pytest): ``python -m mypy`` checks this file with the package (see
``[mypy]`` in setup.cfg), so that a wrong annotation (a ``next()`` typed
to return None, a constructor argument missing) fails the check.  It is
also runnable: ``python tests/typing_usage.py``."""

import io
from typing import Any, Dict, List, Optional, Tuple

import numpy

import chainiter
from chainiter import datasets, distributed, errors, iterators, serializers
from chainiter.dataset import Converter, DatasetMixin


class Squares(DatasetMixin):

    def __len__(self) -> int:
        return 10

    def get_example(self, i: int) -> Tuple[numpy.ndarray, int]:
        return numpy.full(3, i * i, numpy.float32), i


def main() -> None:
    data = numpy.arange(20, dtype=numpy.float32).reshape(10, 2)
    labels = numpy.arange(10)
    pairs = datasets.TupleDataset(data, labels)
    named = datasets.DictDataset(x=data, t=labels)
    train, test = datasets.split_dataset_random(pairs, 8, seed=0)
    parts: List[datasets.SubDataset] = datasets.split_dataset_n(pairs, 2)
    folds = datasets.get_cross_validation_datasets_random(pairs, 2, seed=0)
    both = datasets.ConcatenatedDataset(train, test)
    augmented = datasets.TransformDataset(Squares(), lambda e: e)
    n: int = len(train) + len(parts) + len(folds) + len(both) + len(named)

    it = chainiter.SerialIterator(pairs, 4, shuffle=True, seed=0)
    batch: List[Any] = next(it)
    assert len(it.next()) == 4
    x, t = chainiter.concat_examples(batch)
    epoch: int = it.epoch
    detail: float = it.epoch_detail
    previous: Optional[float] = it.previous_epoch_detail
    new_epoch: bool = it.is_new_epoch
    position: int = it.current_position + it.epoch_size + n + len(it)
    for batch in it.one_epoch():
        assert len(batch) <= 4
    stats: Dict[str, Any] = it.stats
    line: str = chainiter.diagnose(it)
    state = it.state_dict()
    it.load_state_dict(state)

    buffer = io.BytesIO()
    serializers.save_npz(buffer, it, compression=False)
    buffer.seek(0)
    serializers.load_npz(buffer, it, strict=True)
    target: Dict[str, Any] = {}
    it.serialize(serializers.DictionarySerializer(target))
    it.serialize(serializers.NpzDeserializer(target))
    it.reset()
    copied: chainiter.SerialIterator = it.__copy__()
    copied.finalize()

    with chainiter.MultithreadIterator(augmented, 2, repeat=False,
                                       n_threads=2) as threaded:
        for batch in threaded:
            x = chainiter.concat_examples(batch, padding=0)

    with chainiter.MultiprocessIterator(
            pairs, 4, repeat=True, shuffle=False, n_processes=2,
            n_prefetch=2, shared_mem=None, dataset_timeout=None,
            seed=1, converter=chainiter.concat_examples,
            start_method='spawn', worker_init_fn=None,
            shard=(0, 1)) as loading:
        arrays: Tuple[numpy.ndarray, numpy.ndarray] = next(loading)
        x, t = loading.next()
        assert len(next(loading)) == len(arrays)
        shard: Optional[distributed.Shard] = loading.shard
        workers: int = loading.n_processes

    prefetched = chainiter.DevicePrefetcher(
        chainiter.SerialIterator(pairs, 4), device=None, depth=1)
    x, t = next(prefetched)
    assert len(next(prefetched)) == 2
    prefetched.finalize()

    @chainiter.converter()
    def to_pairs(batch: List[Any], device: Any = None) -> Tuple[Any, Any]:
        return chainiter.concat_examples(batch, device)

    convert: Converter = to_pairs
    x, t = convert(batch)
    x = chainiter.to_device(-1, x)

    shared: numpy.ndarray = chainiter.shared_copy(data)
    empty = chainiter.shared_empty((2, 3), numpy.float32)
    info = chainiter.get_worker_info()
    worker: Optional[Tuple[int, int]] = None if info is None else (
        info.id, info.incarnation)
    env: distributed.Shard = distributed.from_environment({})
    bounds: List[Tuple[int, int]] = distributed.share_bounds(10, 2)
    sampler = iterators.ShuffleOrderSampler(numpy.random.RandomState(0))
    ordered = chainiter.SerialIterator(pairs, 3, order_sampler=sampler)
    ordered.finalize()
    try:
        next(it)
    except errors.ChainiterError:
        raise
    it.finalize()
    print(epoch, detail, previous, new_epoch, position, stats, line,
          shape_of(shared), empty.dtype, worker, env, bounds, x, t)


def shape_of(array: numpy.ndarray) -> Tuple[int, ...]:
    return array.shape


if __name__ == '__main__':
    main()
