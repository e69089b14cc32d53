"""Holding back a Ctrl-C while state changes hands."""

import os
import signal
import sys
import threading
from typing import Any, List

try:
    import _signal as _sig     # signal's C module: no enum conversions
except ImportError:            # pragma: no cover
    _sig = signal


# The signals whose Python handlers a block holds back: Ctrl-C, and those
# that programs handle by raising (a timeout's SIGALRM, SIGVTALRM or
# SIGPROF; a scheduler's SIGTERM or SIGUSR1 before it stops a job).  An
# exception from a handler inside a block would leave state half changed,
# whatever the signal.
HELD_SIGNALS = tuple(getattr(signal, name) for name in (
    'SIGINT', 'SIGALRM', 'SIGVTALRM', 'SIGPROF', 'SIGTERM', 'SIGHUP',
    'SIGUSR1', 'SIGUSR2') if hasattr(signal, name))


def _hold(signum, frame):
    if signum not in uninterrupted.held:
        uninterrupted.held.append(signum)


def _restore(swapped):
    """Give each ``(signum, handler)`` of ``swapped`` its handler back, all
    of them, whatever handlers raise meanwhile (``signal.signal`` runs the
    pending ones first, and installs nothing when one raises: it is tried
    again); then raise the first exception."""
    error = None
    for signum, handler in swapped:
        while True:
            try:
                _sig.signal(signum, handler)
                break
            except BaseException as e:
                if error is None:
                    error = e
    if error is not None:
        raise error


class uninterrupted:
    """``with uninterrupted():`` holds back a Ctrl-C (and the other
    signals of ``HELD_SIGNALS`` that have a Python handler) in the main
    thread while state changes hands: a KeyboardInterrupt between closing
    a descriptor and forgetting its number would have it closed again
    later, when the number may be another file's; one between recording a
    task for a worker and sending it would leave the task recorded for
    good.  Each handler is called at the end of the block instead, once
    however many of its signal came, in the order they came; when some
    raise, the first exception is raised once all have run.

    The handlers are swapped for one that only notes the signal (about a
    microsecond): blocking the signals in this thread would not do, since
    Python runs handlers in the main thread whichever thread the kernel
    gave the signal to.  Nested blocks, other threads, SIG_IGN, SIG_DFL and
    handlers that ``signal.getsignal`` reports as None are left as they
    are (a handler that C code installed behind Python's back, which
    getsignal cannot see, is replaced for the block).  Keep the blocks
    short and free of the user's code: a signal cannot break them.
    """

    __slots__ = ('_swapped',)
    held: List[Any] = []     # the signals held back, in the order they came
    # [(signum, handler)] swapped out, or about to be, while in a block:
    # a block opened meanwhile (by a handler that runs while the others
    # are swapped) is nested, and a child forked meanwhile restores them.
    saved = None

    def __enter__(self):
        self._swapped = None
        if uninterrupted.saved is not None or \
                threading.current_thread() is not threading.main_thread():
            return self         # nested, or not where handlers run
        swapped = uninterrupted.saved = self._swapped = []
        try:
            for signum in HELD_SIGNALS:
                handler = _sig.getsignal(signum)
                if handler is _hold or not callable(handler):
                    continue
                # Listed first: whatever raises from here on, the handler
                # is given back.  Until signal() returns, a handler
                # raises here, before the block; from then on, this
                # signal's handler is _hold.
                swapped.append((signum, handler))
                _sig.signal(signum, _hold)
        except BaseException:
            # A handler's exception; one of those held goes up instead.
            self._release(1)
            raise
        return self

    def __exit__(self, *exc):
        if self._swapped is not None:
            self._release(2)
        return False

    def _release(self, depth):
        """Give the handlers back, then call those of the signals held,
        as Python would have called them in the caller ``depth`` frames
        up (not through raise_signal(): a wakeup fd, asyncio's, would see
        the signal twice).  Raises the first exception a handler
        raised."""
        swapped, self._swapped = self._swapped, None
        error = None
        try:
            _restore(swapped)
        except BaseException as e:
            error = e
        uninterrupted.saved = None
        if uninterrupted.held:
            held, uninterrupted.held = uninterrupted.held, []
            handlers = dict(swapped)
            frame = sys._getframe(depth)
            for signum in held:
                try:
                    handlers[signum](signum, frame)   # only theirs held
                except BaseException as e:
                    if error is None:
                        error = e
        if error is not None:
            raise error


def _after_fork_in_child():
    # Forked by another thread inside a block: the child's main thread is
    # in no block, and would hold back its signals for good.
    saved, uninterrupted.saved = uninterrupted.saved, None
    uninterrupted.held = []
    for signum, handler in saved or ():
        if _sig.getsignal(signum) is _hold:
            _sig.signal(signum, handler)


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork_in_child)
