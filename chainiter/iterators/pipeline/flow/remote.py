"""Exceptions raised in a worker, sent home with their traceback and
raised again in the main process."""

import pickle
import traceback
import typing

from chainiter._context import describe_indices
from chainiter.errors import ChainiterError

class RemoteError(typing.NamedTuple):
    """An exception raised in a worker, sent home with its traceback."""
    exception: object       # the exception, or None if it could not be pickled
    type_name: str
    message: str
    traceback: typing.Optional[str]    # None: raised in the main thread,
    #                                    whose own traceback it keeps
    index: object           # the dataset index, or the list of a chunk's
                            # indices (an error in the batch method)


class RemoteTraceback(Exception):
    """Holds the formatted traceback of a worker; set as ``__cause__``."""

    def __init__(self, tb):
        super().__init__(tb)
        self.tb = tb

    def __str__(self):
        return '\n\n"""\n{}"""'.format(self.tb)



def capture(e, index):
    """``e`` raised in a worker process, to send home."""
    tb = ''.join(traceback.format_exception(type(e), e, e.__traceback__))
    try:
        pickle.loads(pickle.dumps(e))
        exception = e
    except Exception:
        exception = None
    return RemoteError(exception, type(e).__qualname__, str(e), tb, index)


def capture_in_main(e, index):
    """``e`` raised in the main thread loading a worker thread's task
    (``threads/workers.py``): the exception itself, with its own
    traceback (nothing formatted here, where a signal handler may
    run)."""
    return RemoteError(e, type(e).__qualname__, '', None, index)


def capture_here(e, index):
    """``e`` raised in a worker thread: the exception itself."""
    tb = ''.join(traceback.format_exception(type(e), e, e.__traceback__))
    return RemoteError(e, type(e).__qualname__, str(e), tb, index)



def startup_payload(error):
    """What a worker that could not start sends home: the ``RemoteError``
    with its exception pickled apart, so that an exception the main
    process cannot unpickle leaves the rest readable."""
    exception = None if error.exception is None else \
        pickle.dumps(error.exception, pickle.HIGHEST_PROTOCOL)
    return pickle.dumps(([], error._replace(exception=None), exception),
                        pickle.HIGHEST_PROTOCOL)


def startup_error(payload):
    """The ``RemoteError`` of ``startup_payload``, in the main process."""
    _, error, exception = pickle.loads(payload)
    if exception is None:
        return error
    try:
        return error._replace(exception=pickle.loads(exception))
    except Exception as e:
        return error._replace(message='{} (a {}, which cannot be unpickled '
                              'in the main process: {}: {})'.format(
                                  error.message, error.type_name,
                                  type(e).__name__, e))


def _where(index):
    """What was being loaded: ``dataset[5]``, or the examples of a chunk
    (the dataset's batch method raised)."""
    if isinstance(index, list):
        return 'the examples {} with the dataset\'s batch method'.format(
            describe_indices(index))
    return 'dataset[{}]'.format(index)


def rebuild_error(remote):
    where = _where(remote.index)
    if remote.exception is not None:
        error = remote.exception
    else:
        error = ChainiterError(
            '{}: {} (raised in a worker while loading {}; the exception '
            'itself could not be pickled)'.format(
                remote.type_name, remote.message, where))
    if remote.traceback is not None:
        error.__cause__ = RemoteTraceback(remote.traceback)
    notes = getattr(error, '__notes__', [])
    if hasattr(error, 'add_note') and not any(where in n for n in notes):
        error.add_note('raised while loading {} in a worker '
                       'process'.format(where))
    return error
