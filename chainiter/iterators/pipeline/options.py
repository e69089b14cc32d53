"""What ``MultiprocessIterator.__init__`` was given, checked once and
read into one frozen ``Options``, with what follows from it (whether the
workers stack, the first and largest depth, whether batches may go in
groups).  Pure (the checks of what worker processes get: ``checks.py``)."""

import dataclasses
import functools
from typing import Any, Callable, Optional

from chainiter.dataset.convert import concat_examples
from chainiter.iterators import _args


@dataclasses.dataclass(frozen=True)
class Options:
    n_processes: int
    n_prefetch: Optional[int]
    prefetch_bytes: int
    shared_mem: Optional[int]
    dataset_timeout: Optional[float]
    maxtasksperchild: Optional[int]
    converter: Optional[Callable[..., Any]]
    converter_in_workers: bool
    start_method: str
    worker_init_fn: Optional[Callable[[int], Any]]
    cpus: int               # read once (cgroup files: 0.15 ms)
    stacked: bool           # concat_examples: the workers stack
    listed: bool            # no converter: they stack, and the batch is
    #                         the list of its examples made of the rows
    padding: Any            # its padding (None: none)
    in_workers: bool        # another converter runs in the workers
    may_group: bool         # batches may go to the workers in groups
    first_depth: int        # batches in flight until the first is measured
    max_depth: int          # at most (the slots made)


def stacking_padding(converter):
    """``(True, padding)`` when ``converter`` is ``concat_examples`` or a
    ``functools.partial`` of it with only ``padding``; else
    ``(False, None)``."""
    if converter is concat_examples:
        return True, None
    if isinstance(converter, functools.partial) and \
            converter.func is concat_examples and not converter.args and \
            set(converter.keywords) <= {'padding'}:
        return True, converter.keywords.get('padding')
    return False, None


def read(cpus, n_processes, n_prefetch, prefetch_bytes, shared_mem,
         dataset_timeout, maxtasksperchild, converter, converter_in_workers,
         start_method, worker_init_fn, max_prefetch_per_worker,
         workers='n_processes'):
    """The checked ``Options`` (the dataset's own checks, and its pickle
    check, come after: see ``check_dataset``).  ``workers`` names the
    argument that gave ``n_processes`` (``'n_threads'`` for worker
    threads, whose start method is ``'threads'``)."""
    if n_processes is None:
        n_processes = cpus
    n_processes = _args.positive_int(
        workers, n_processes,
        hint='; use SerialIterator to load in the main process')
    n_prefetch = _args.positive_int('n_prefetch', n_prefetch,
                                    allow_none=True)
    prefetch_bytes = _args.positive_int(
        'prefetch_bytes', prefetch_bytes, hint=' (bytes)')
    shared_mem = _args.positive_int(
        'shared_mem', shared_mem, allow_none=True,
        hint=' (bytes per example)')
    maxtasksperchild = _args.positive_int(
        'maxtasksperchild', maxtasksperchild, allow_none=True)
    dataset_timeout = _args.seconds('dataset_timeout', dataset_timeout)
    _args.callable_or_none('converter', converter)
    if not isinstance(converter_in_workers, bool):
        raise TypeError('converter_in_workers must be True or False, '
                        'got {!r}'.format(converter_in_workers))
    if converter_in_workers and converter is None:
        raise ValueError('converter_in_workers=True runs the converter '
                         'in the workers, but no converter was given: '
                         'pass converter=...')
    _args.callable_or_none('worker_init_fn', worker_init_fn)
    # start_method: resolved by the caller (``checks.start_method`` for
    # processes, 'threads' for worker threads).
    stacked, padding = stacking_padding(converter)
    # Without a converter the batch is the list of examples, as loaded:
    # the workers stack them all the same (StackedExamples).
    listed = converter is None
    stacked = stacked or listed
    # concat_examples stacks in the workers already, with no copy.
    in_workers = converter_in_workers and not stacked
    # An explicit n_prefetch is a floor: the depth tunes itself above it,
    # within the same budget as without it.
    max_depth = max(n_prefetch or 0, max_prefetch_per_worker * n_processes)
    # Until the first batch is measured, 1: that batch is then split
    # among the workers and arrives soonest.
    first_depth = n_prefetch or 1
    if in_workers:
        # At least a batch per worker in flight, to start with (the book
        # never splits a batch for the converter in the workers: it takes
        # whole ones).
        first_depth = max(first_depth, n_processes)
        max_depth = max(max_depth, n_processes)
    return Options(
        n_processes=n_processes, n_prefetch=n_prefetch,
        prefetch_bytes=prefetch_bytes, shared_mem=shared_mem,
        dataset_timeout=dataset_timeout, maxtasksperchild=maxtasksperchild,
        converter=converter, converter_in_workers=converter_in_workers,
        start_method=start_method, worker_init_fn=worker_init_fn, cpus=cpus,
        stacked=stacked, listed=listed, padding=padding,
        in_workers=in_workers,
        # A group counts as its batches: against an explicit n_prefetch
        # (batches in flight) and maxtasksperchild (tasks).
        may_group=stacked,
        first_depth=first_depth, max_depth=max_depth)
