"""Where a thread pool's tasks are loaded on a build with the GIL: in the
worker threads, or in the main thread itself, in ``next()`` while it
waits (``threads/workers.py``'s ``MainThreadTasks``).  Pure: the clock is
the caller's.

With the GIL, worker threads run only as fast as the parts of loading
that release it (numpy copies of large arrays, I/O, decoding in C).  A
dataset that holds it (many small numpy calls, Python per example)
makes the threads take turns with the main thread and hand the GIL back
and forth, which is slower than loading in the main thread alone.
Which one wins depends on the dataset and on what the training loop
does between batches (a loop that releases the GIL lets the threads
load in the meantime), so it is measured where the user sees it: the
examples handed out per second, one window with each, and the faster
one kept.  The measure is taken again at doubling intervals, in case
the loop or the data change.
"""

import typing


class Window(typing.NamedTuple):
    """A window being measured: since ``start`` (seconds), ``examples``
    and ``batches`` handed out."""
    start: float
    examples: int
    batches: int


class LoadingMode:
    """The choice between the worker threads and the main thread, made
    from the batches handed out (``handed_out``).

    It begins with the threads.  ``first_probe_s`` after the first batch
    it measures the mode in use over a window (at least ``window_s`` and
    ``window_batches`` batches), switches to the other, lets the batches
    already in flight go by (``in_flight``: they were loaded the other
    way), measures again, and keeps the main thread only when it handed
    out more than ``margin`` times as many examples per second (the
    threads load ahead, which a loop that varies needs).  A window of the
    mode switched to that is plainly slower (half the other's rate, after
    ``window_batches // 4`` batches, at least 2, and a quarter of
    ``window_s``) ends early: images, whose copies
    release the GIL, pay little for the probe.  The next probe comes
    ``first_probe_s * 2`` later, then at doubling intervals up to
    ``max_interval_s`` (quadrupling after a probe plainly lost).
    """

    def __init__(self, first_probe_s=0.5, window_s=0.25, window_batches=16,
                 margin=1.05, max_interval_s=64.0):
        self.main = False          # the mode in use: True, the main thread
        self.first_probe_s = first_probe_s
        self.window_s = window_s
        self.window_batches = window_batches
        self.margin = margin
        self.max_interval_s = max_interval_s
        self.interval = first_probe_s
        self.next_probe = None     # when to measure again
        self.probes = 0            # windows of the other mode measured
        # While measuring: 'current', 'skip' or 'other'.
        self.phase = None
        self.window = None
        self.skip = 0
        self.rates = {}            # the last rate measured of each mode

    def handed_out(self, now, examples, in_flight):
        """A batch of ``examples`` was handed out at ``now`` (seconds),
        ``in_flight`` batches being loaded or ready behind it.  Returns
        the mode to switch to (True: the main thread, False: the
        threads), or None to stay."""
        if self.next_probe is None:
            self.next_probe = now + self.first_probe_s
            return None
        if self.phase is None:
            if now >= self.next_probe:
                self.phase = 'current'
                self.window = Window(now, 0, 0)
            return None
        if self.phase == 'skip':
            self.skip -= 1
            if self.skip <= 0:
                self.phase = 'other'
                self.window = Window(now, 0, 0)
            return None
        window = self.window = Window(
            self.window.start, self.window.examples + examples,
            self.window.batches + 1)
        elapsed = now - window.start
        rate = window.examples / elapsed if elapsed > 0 else None
        if self.phase == 'current':
            if elapsed < self.window_s or \
                    window.batches < self.window_batches or rate is None:
                return None
            self.rates[self.main] = rate
            self.phase = 'skip'
            self.skip = in_flight
            self.main = not self.main
            return self.main
        # 'other': the mode switched to is being measured, against the
        # rate of the one measured just before.
        before = self.rates[not self.main]
        # (A quarter of the window at least: the main thread loads a group
        # of small batches in the wait for its first.)
        plainly_slower = rate is not None and \
            window.batches >= max(2, self.window_batches // 4) and \
            elapsed >= self.window_s / 4 and rate * 2 < before
        if not plainly_slower and (
                elapsed < self.window_s or
                window.batches < self.window_batches or rate is None):
            return None
        self.rates[self.main] = rate
        self.probes += 1
        self.phase = None
        self.window = None
        # A probe that was plainly lost waits twice as long again.
        self.interval = min(self.interval * (4 if plainly_slower else 2),
                            self.max_interval_s)
        self.next_probe = now + self.interval
        threads, main = (before, rate) if self.main else (rate, before)
        keep_main = main > threads * self.margin
        if keep_main == self.main:
            return None
        self.main = keep_main
        return keep_main
