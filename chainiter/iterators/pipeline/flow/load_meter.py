"""The load meter: how long the workers took to load the examples, and how
long they waited for a CPU meanwhile, in all since the pool started.

Rates over a window ("per example since the last sample") are the
difference of two samples: the grouping policy, the active-workers
controller and ``stats['worker_busy']`` each keep the sample their window
began with.  A ``Sample`` is immutable and the meter replaces it whole,
in one assignment (the receiver thread, under the pool lock): a reader in
another thread takes ``meter.sample`` without the lock and never sees one
sum updated without the others.  Pure."""

import typing


class Sample(typing.NamedTuple):
    load_s: float       # the workers' seconds loading, in all
    loaded: int         # the examples loaded in those seconds
    queued_s: float     # and the seconds they waited for a CPU

    def per_example_since(self, earlier):
        """Seconds an example took to load since ``earlier`` (a sample of
        the same meter), or None when none was loaded since."""
        if self.loaded <= earlier.loaded:
            return None
        return (self.load_s - earlier.load_s) / (self.loaded - earlier.loaded)


ZERO = Sample(0.0, 0, 0.0)


class LoadMeter:

    def __init__(self):
        self.sample = ZERO

    def add(self, load_s, examples, queued_s=0.0):
        """A worker loaded ``examples`` in ``load_s`` seconds, and waited
        ``queued_s`` of them for a CPU."""
        last = self.sample
        self.sample = Sample(last.load_s + load_s, last.loaded + examples,
                             last.queued_s + queued_s)
