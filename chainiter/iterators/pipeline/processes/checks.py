"""What worker processes need of ``MultiprocessIterator``'s arguments,
checked before any worker starts: the start method, and under spawn and
forkserver that what they get by pickling pickles."""

import multiprocessing

from chainiter.iterators import _args
from chainiter.iterators.pipeline.processes import (
    array_pickle, by_value, launch)


def start_method(name):
    """The start method that ``name`` (None: Python's default) gives,
    refused inside a worker's bootstrap (``launch.refuse_in_bootstrap``)."""
    name = _args.start_method(name)
    method = multiprocessing.get_context(name).get_start_method()
    launch.refuse_in_bootstrap(method)
    return method


def check_picklable(obj, what, method):
    try:
        # As the workers get it, large arrays left out: no copy of them.
        array_pickle.check_picklable(obj)
    except RuntimeError:
        # Locks, events and queues of multiprocessing pickle only while a
        # process starts; they reach the workers then.
        pass
    except by_value.Missing as e:
        raise TypeError(
            'MultiprocessIterator with start method {!r} sends the {} to the '
            'worker processes by pickling, and it holds {}: only cloudpickle '
            'can send that, by value, and it is not installed. Run: pip '
            'install cloudpickle (or define it at the top level of a module '
            'the workers can import, or use start_method="fork")'.format(
                method, what, by_value.describe(e.obj))) from e.error
    except Exception as e:
        raise TypeError(
            'MultiprocessIterator with start method {!r} sends the {} to the '
            'worker processes by pickling, but it cannot be pickled ({}: '
            '{}). Define its class and the functions it uses at module '
            'level (not inside a function), or use '
            'start_method="fork"'.format(method, what, type(e).__name__, e)
        ) from e


def check_sent(options, dataset):
    """Under spawn and forkserver, what the workers get by pickling
    pickles (checked before any worker starts)."""
    method = options.start_method
    if method == 'fork':
        return
    check_picklable(dataset, 'dataset', method)
    if options.worker_init_fn is not None:
        check_picklable(options.worker_init_fn, 'worker_init_fn', method)
    if options.in_workers:
        check_picklable(options.converter, 'converter', method)
