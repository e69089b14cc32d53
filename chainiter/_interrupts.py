"""Holding back a Ctrl-C while state changes hands."""

import signal
import threading

try:
    import _signal as _sig     # signal's C module: no enum conversions
except ImportError:            # pragma: no cover
    _sig = signal


def _hold(signum, frame):
    uninterrupted.held = True


class uninterrupted:
    """``with uninterrupted():`` holds back a Ctrl-C in the main thread
    while state changes hands: a KeyboardInterrupt between closing a
    descriptor and forgetting its number would have it closed again later,
    when the number may be another file's; one between recording a task
    for a worker and sending it would leave the task recorded for good;
    one inside ``reset()`` would leave the iterator half reset.  The SIGINT
    handler runs at the end of the block instead.

    The handler is swapped for one that only notes the signal (about a
    microsecond): blocking SIGINT in this thread would not do, since
    Python runs the handler in the main thread whichever thread the kernel
    gave the signal to.  Nested blocks, other threads, and handlers not
    set from Python (which raise nothing) are left as they are.
    """

    __slots__ = ('_handler',)
    held = False

    def __enter__(self):
        self._handler = None
        if threading.current_thread() is not threading.main_thread():
            return self
        handler = _sig.getsignal(signal.SIGINT)
        if handler is _hold or not callable(handler):
            return self
        uninterrupted.held = False
        # Until this returns, an interrupt raises here, before the block;
        # from then on, the handler is _hold.
        _sig.signal(signal.SIGINT, _hold)
        self._handler = handler
        return self

    def __exit__(self, *exc):
        handler = self._handler
        if handler is not None:
            self._handler = None
            _sig.signal(signal.SIGINT, handler)
            if uninterrupted.held:
                uninterrupted.held = False
                _sig.raise_signal(signal.SIGINT)    # the handler runs now
        return False
