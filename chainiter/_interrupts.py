"""Holding back a Ctrl-C while state changes hands."""

import os
import signal
import sys
import threading

try:
    import _signal as _sig     # signal's C module: no enum conversions
except ImportError:            # pragma: no cover
    _sig = signal


def _hold(signum, frame):
    uninterrupted.held = True


def _set(handler):
    """Install ``handler`` for SIGINT, whatever other signals' handlers
    raise meanwhile (``signal.signal`` runs the pending ones first); their
    first exception is raised once it is installed."""
    error = None
    while True:
        try:
            _sig.signal(signal.SIGINT, handler)
            break
        except BaseException as e:     # a SIGALRM timeout's, say
            if error is None:
                error = e
    if error is not None:
        raise error


class uninterrupted:
    """``with uninterrupted():`` holds back a Ctrl-C in the main thread
    while state changes hands: a KeyboardInterrupt between closing a
    descriptor and forgetting its number would have it closed again later,
    when the number may be another file's; one between recording a task
    for a worker and sending it would leave the task recorded for good.
    The SIGINT handler is called at the end of the block instead, once,
    however many came.

    The handler is swapped for one that only notes the signal (about a
    microsecond): blocking SIGINT in this thread would not do, since
    Python runs the handler in the main thread whichever thread the kernel
    gave the signal to.  Nested blocks, other threads, SIG_IGN, SIG_DFL and
    handlers that ``signal.getsignal`` reports as None are left as they
    are (a handler that C code installed behind Python's back, which
    getsignal cannot see, is replaced for the block).  Keep the blocks
    short and free of the user's code: a Ctrl-C cannot break them.
    """

    __slots__ = ('_handler',)
    held = False
    saved = None        # the handler swapped out, for a forked child

    def __enter__(self):
        self._handler = None
        if threading.current_thread() is not threading.main_thread():
            return self
        handler = _sig.getsignal(signal.SIGINT)
        if handler is _hold or not callable(handler):
            return self
        uninterrupted.held = False
        uninterrupted.saved = self._handler = handler
        try:
            # Until this returns, an interrupt raises here, before the
            # block; from then on, the handler is _hold.
            _sig.signal(signal.SIGINT, _hold)
        except BaseException:
            self._handler = None
            if _sig.getsignal(signal.SIGINT) is _hold:
                _set(handler)
            raise
        return self

    def __exit__(self, *exc):
        handler = self._handler
        if handler is not None:
            self._handler = None
            _set(handler)
            uninterrupted.saved = None
            if uninterrupted.held:
                uninterrupted.held = False
                # As Python would call it (not raise_signal(): a wakeup
                # fd, asyncio's, would see the signal twice).
                handler(signal.SIGINT, sys._getframe(1))
        return False


def _after_fork_in_child():
    # Forked by another thread inside a block: the child's main thread is
    # in no block, and would ignore Ctrl-C for good.
    saved, uninterrupted.saved = uninterrupted.saved, None
    if saved is not None and _sig.getsignal(signal.SIGINT) is _hold:
        _sig.signal(signal.SIGINT, saved)


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork_in_child)
