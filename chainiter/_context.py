"""What code inside ``dataset[i]`` may ask about where it runs.

``example_rng()`` gives a generator keyed by ``(seed, epoch, position)`` of the
example being loaded, so random augmentation is the same for every iterator
kind, worker count and after resume.  ``get_worker_info()`` describes the
worker process, or is ``None`` in the main process.

Every transport loads examples through ``load_example``, which sets the
(thread-local) key around the call to ``dataset[i]``.
"""

import threading
import typing

from chainiter.iterators.order_samplers import example_generator

_local = threading.local()
_worker_info = None


class WorkerInfo(typing.NamedTuple):
    """Describes the worker process that runs the current code."""
    id: int
    num_workers: int
    seed: int


class _Loading:
    """What the current thread is loading: the key of ``example_rng()``
    and the generator made for it (a plain object per thread: setting an
    attribute of ``threading.local`` costs several times more)."""
    __slots__ = ('key', 'rng')

    def __init__(self):
        self.key = None
        self.rng = None


def _loading():
    try:
        return _local.loading
    except AttributeError:
        _local.loading = _Loading()
        return _local.loading


def example_rng():
    """The ``numpy.random.Generator`` of the example being loaded.

    Call it inside ``dataset[i]`` (or a ``TransformDataset`` transform) while
    a chainiter iterator loads that example.  Repeated calls while loading one
    example return the same generator, so successive draws differ.
    """
    loading = _loading()
    key = loading.key
    if key is None:
        raise RuntimeError(
            'chainiter.example_rng() was called outside of an example load. '
            'It works only inside dataset[i] while a chainiter iterator '
            'loads example i; elsewhere create your own '
            'numpy.random.default_rng(seed).')
    cached = loading.rng
    if cached is not None and cached[0] is key:
        return cached[1]
    rng = example_generator(*key)
    loading.rng = (key, rng)
    return rng


def get_worker_info():
    """``WorkerInfo(id, num_workers, seed)`` inside a worker process of
    ``MultiprocessIterator``; ``None`` in the main process."""
    return _worker_info


def set_worker_info(info):
    global _worker_info
    _worker_info = info


def load_example(dataset, index, seed, epoch, position):
    """``dataset[index]`` with ``example_rng()`` keyed for this example."""
    out = []
    load_examples(dataset, [int(index)], seed,
                  ((int(epoch), int(position), int(position) + 1),), out)
    return out[0]


def load_examples(dataset, indices, seed, spans, out):
    """Append ``dataset[i]`` for each index to ``out``, each with
    ``example_rng()`` keyed for it.  ``indices`` is an int array or a list
    of ints; ``spans`` gives their epochs and positions (see ``Step``).
    When one raises, ``out`` holds the examples before it (so
    ``indices[len(out)]`` is the one that failed)."""
    loading = _loading()
    if hasattr(indices, 'tolist'):
        indices = indices.tolist()
    append = out.append
    remaining = iter(indices)
    epoch = position = None
    try:
        # One key object per example: example_rng() builds its generator
        # only when called, and knows the key by identity.
        for epoch, start, stop in spans:
            for position, index in zip(range(start, stop), remaining):
                loading.key = (seed, epoch, position)
                append(dataset[index])
    except Exception as e:
        if hasattr(e, 'add_note'):  # Python 3.11+
            e.add_note('raised while loading dataset[{}] (epoch {}, position '
                       '{})'.format(indices[len(out)], epoch, position))
        raise
    finally:
        loading.key = None
        loading.rng = None
    return out
