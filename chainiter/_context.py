"""What code inside ``dataset[i]`` may ask about where it runs.

``example_rng()`` gives a generator keyed by ``(seed, epoch, position)`` of the
example being loaded, so random augmentation is the same for every iterator
kind, worker count and after resume.  ``get_worker_info()`` describes the
worker process, or is ``None`` in the main process.

Every transport loads examples through ``load_examples``, which sets the
(thread-local) key around the call to ``dataset[i]``.

A dataset with a batch method (``get_examples(indices)``, or PyTorch's
``__getitems__(indices)``) is asked for a whole chunk at once instead: one
call, with the keys of all its examples set, so that ``example_rngs()``
gives one generator per example (``example_rng()`` there is an error: it
could not tell which example is meant).
"""

import threading
import typing
from typing import List, Optional

import numpy

from chainiter.iterators.order_samplers import example_generator

_local = threading.local()
_worker_info = None


class _WorkerFields(typing.NamedTuple):
    id: int
    num_workers: int
    seed: int


class WorkerInfo(_WorkerFields):
    """Describes the worker process that runs the current code (the
    fields: ``get_worker_info``).  A tuple of ``(id, num_workers, seed)``,
    as it always was (``wid, n, seed = get_worker_info()`` unpacks it);
    ``incarnation`` is an attribute beside them."""
    def __new__(cls, id: int, num_workers: int, seed: int,
                incarnation: int = 0) -> 'WorkerInfo':
        self = super().__new__(cls, id, num_workers, seed)
        self.__dict__['_incarnation'] = incarnation
        return self

    @property
    def incarnation(self) -> int:
        """How many workers had this id before this one (0: the first)."""
        return self.__dict__.get('_incarnation', 0)

    def _replace(self, **fields: int) -> 'WorkerInfo':
        incarnation = fields.pop('incarnation', self.incarnation)
        return WorkerInfo(*super()._replace(**fields),
                          incarnation=incarnation)

    def __repr__(self) -> str:
        return 'WorkerInfo(id={}, num_workers={}, seed={}, ' \
            'incarnation={})'.format(self.id, self.num_workers, self.seed,
                                     self.incarnation)


class _Loading:
    """What the current thread is loading: the key of ``example_rng()``
    and the generator made for it (a plain object per thread: setting an
    attribute of ``threading.local`` costs several times more)."""
    __slots__ = ('key', 'rng', 'batch')

    def __init__(self):
        self.key = None
        self.rng = None
        self.batch = None    # in a batch method: (seed, spans, n, name)


def _loading():
    try:
        return _local.loading
    except AttributeError:
        _local.loading = _Loading()
        return _local.loading


def example_rng() -> numpy.random.Generator:
    """The ``numpy.random.Generator`` of the example being loaded.

    Call it inside ``dataset[i]`` (or a ``TransformDataset`` transform) while
    a chainiter iterator loads that example.  Repeated calls while loading one
    example return the same generator, so successive draws differ.
    """
    loading = _loading()
    key = loading.key
    if key is None:
        if loading.batch is not None:
            raise RuntimeError(
                'chainiter.example_rng() was called inside the dataset\'s '
                'batch method {}(indices), which loads many examples at '
                'once, so it cannot tell which example the generator is '
                'for. Call chainiter.example_rngs() there instead (one '
                'generator per index, in order), or draw in dataset[i] and '
                'remove the batch method (set it to None)'.format(
                    loading.batch[3]))
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


def example_rngs() -> List[numpy.random.Generator]:
    """The ``numpy.random.Generator`` of each example being loaded, in the
    order of the indices: call it inside a batch method
    (``dataset.get_examples(indices)`` or ``__getitems__``); generator
    ``j`` is the one ``example_rng()`` gives inside ``dataset[indices[j]]``,
    so a batch method that draws example ``j``'s augmentation from it makes
    the same batches as ``dataset[i]`` would.  Inside ``dataset[i]`` it is
    ``[example_rng()]``."""
    loading = _loading()
    batch = loading.batch
    if batch is None:
        return [example_rng()]
    seed, spans = batch[0], batch[1]
    return [example_generator(seed, epoch, position)
            for epoch, start, stop in spans
            for position in range(start, stop)][:batch[2]]


def get_worker_info() -> Optional[WorkerInfo]:
    """``WorkerInfo(id, num_workers, seed, incarnation)`` inside a worker
    process of ``MultiprocessIterator``; ``None`` in the main process.

    ``id`` is 0 to ``num_workers - 1``; a worker that replaces another
    (after ``maxtasksperchild`` or a death) takes its id, and
    ``incarnation`` counts the workers that had that id before it (0 for
    the first).  ``seed`` is what the worker seeded Python's ``random``
    (and torch, when imported) with: ``seed + id`` for the first worker of
    each id, as PyTorch's ``DataLoader``; ``seed + id + incarnation *
    num_workers`` for a replacement, which so draws numbers of its own.

    In a worker thread of ``MultithreadIterator`` it describes that
    thread, with the same fields; the threads share the process's global
    generators and seed none of them.  ``None`` in any other thread."""
    return getattr(_local, 'worker_info', _worker_info)


def set_worker_info(info):
    """The process's (a worker process)."""
    global _worker_info
    _worker_info = info


def set_thread_worker_info(info):
    """The calling thread's (a worker thread, or the main thread loading
    as one); None: the process's again (a worker process forked from
    this thread has its own).  Returns the thread's before (None: it had
    none), to set back."""
    previous = _local.__dict__.get('worker_info')
    if info is None:
        _local.__dict__.pop('worker_info', None)
    else:
        _local.worker_info = info
    return previous


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
    ``indices[len(out)]`` is the one that failed).

    A dataset with a batch method (``batch_method``) is called once for
    all the indices instead, and ``out.extend`` takes what it returns;
    when that raises, the whole chunk failed."""
    loading = _loading()
    if hasattr(indices, 'tolist'):
        indices = indices.tolist()
    name, method = _find_batch_method(dataset)
    if method is not None:
        return _load_batch(name, method, indices, seed, spans, out)
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


#: The names of a dataset's batch method, in the order they are looked for.
BATCH_METHODS = ('get_examples', '__getitems__')


def batch_method(dataset):
    """The dataset's batch method (``get_examples``, else PyTorch's
    ``__getitems__``), or None.  One set to None (PyTorch's way of turning
    it off) counts as none."""
    return _find_batch_method(dataset)[1]


def _find_batch_method(dataset):
    for name in BATCH_METHODS:
        method = getattr(dataset, name, None)
        if method is not None:
            return name, method
    return None, None


def describe_indices(indices, limit=32):
    """``[3, 5, 8]``, or the first ``limit`` and how many in all."""
    if len(indices) <= limit:
        return '[{}]'.format(', '.join(map(str, indices)))
    return '[{}, ...] ({} indices)'.format(
        ', '.join(map(str, indices[:limit])), len(indices))


def _load_batch(name, method, indices, seed, spans, out):
    """``out.extend(method(indices))``, ``example_rngs()`` keyed for the
    examples; a wrong number of examples is an error, nothing is cut or
    filled up.  When the method raises, ``out`` is unchanged."""
    loading = _loading()
    loading.batch = (seed, spans, len(indices), name)
    try:
        examples = method(indices)
        try:
            n = len(examples)
        except TypeError:
            raise TypeError(
                'the dataset\'s batch method {}(indices) returned a {}, '
                'which has no length; it must return a sequence (e.g. a '
                'list) of one example per index, in order'.format(
                    name, type(examples).__name__)) from None
        if n != len(indices):
            raise ValueError(
                'the dataset\'s batch method {}(indices) returned {} '
                'examples for {} indices; it must return one example per '
                'index, in order'.format(name, n, len(indices)))
        out.extend(examples)
    except Exception as e:
        if hasattr(e, 'add_note'):  # Python 3.11+
            e.add_note('raised while loading the examples {} with the '
                       'dataset\'s batch method {} ({})'.format(
                           describe_indices(indices), name,
                           _describe_spans(spans)))
        raise
    finally:
        loading.batch = None
    return out


def _describe_spans(spans):
    return ', '.join('epoch {}, positions {}..{}'.format(e, a, b - 1)
                     for e, a, b in spans)
