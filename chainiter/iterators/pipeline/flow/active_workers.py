"""How many workers take tasks (``ActiveWorkers``): the controller the book
asks each time a batch is handed out.  Pure."""

import math

from chainiter.iterators.pipeline.flow.load_meter import Sample

#: How many batches ``ActiveWorkers`` looks at before it decides again.
ADAPT_BATCHES = 64

#: How many batches, most of them waited for, double the workers that
#: the first batch found crowded (``ActiveWorkers``).
GROW_BATCHES = 2


class ActiveWorkers:
    """How many of the ``n`` workers take tasks: all of them at first
    (unless the first batch finds them crowded on the ``cpus``, below),
    twice as many (up to all) after ``next()`` waited for batches; else,
    when the consumer is slower than the loading, those that the loading
    keeps busy and a margin (1.5 times the workers busy on average, plus
    one, at least two), falling by half a window at most.  Idle workers
    beyond that only cost: each task would wake a process that has slept
    long, and on few cores that process takes the core from the consumer
    (16 workers on 2 cores loaded tiny examples at 0.6 the speed of 2).

    The workers busy are the seconds an example takes to load times the
    examples handed out per second, not the loading seconds that arrived
    in the window: a window may hand out batches loaded before it began
    (after a pause of the consumer, or held in order behind a late one),
    quickly, and then few results arrive in it although the consumer is
    the faster side.

    The loading seconds leave out those a worker waited for a CPU while it
    could run (``worker.RunQueueClock``): with more processes than cores
    the wall time of a task grows with the number of workers, and taken
    for work it kept eight of 16 workers busy on 2 cores, at 0.75 the
    speed of 2.  Nor do waits of ``next()`` double the workers when they
    wait for CPUs that long already (a quarter of their loading).

    The first batch tells the crowd at once: when its loading waited that
    long for a CPU and there are more workers than twice the ``cpus``,
    twice the ``cpus`` take tasks (at least two).  Workers beyond that
    only help while they wait on something else (I/O, a lock).  16
    workers on 2 CPUs, all of them cutting the first batches of 38 MB
    among them, took 1-1.25 s to reach full speed; 4 took 0.5 s.  The
    first batch may wait for CPUs for other reasons (workers still
    starting, a first access that builds an index), so until a window
    has decided, every ``GROW_BATCHES`` batches in which ``next()``
    mostly waited and the workers did not wait for CPUs double the count.
    Nor does the cap stay for a deep pipeline (``deep``): the few workers
    would hold the tasks of all its batches, which do not move to the
    workers that join later.

    Pure: ``batch`` is told the time and the workers' loading seconds,
    examples and seconds waiting for a CPU.
    """

    def __init__(self, n, cpus=None):
        self.n = n
        self.count = n
        self._cpus = cpus
        self._capped = False    # by the first batch, no window since
        self._deep = False      # deep() was called: no cap
        self._start = None      # (time, the load meter's Sample)
        self._batches = 0
        self._waited = 0
        self._handed = 0        # examples handed out in the window

    def deep(self):
        """More batches in flight than workers: the first batch's cap, if
        still on, is lifted; returns the count."""
        self._deep = True
        if self._capped:
            self.count = self.n
            self._capped = False
        return self.count

    def batch(self, waited, now, load_s, loaded, size, queued_s=0.0):
        """A batch of ``size`` examples was handed out (``waited``:
        ``next()`` found none ready) at ``now``, the workers having loaded
        ``loaded`` examples in ``load_s`` seconds in all, and waited
        ``queued_s`` seconds for a CPU meanwhile; returns how many workers
        take tasks from now on."""
        sample = Sample(load_s, loaded, queued_s)
        if self._start is None:
            self._start = (now, sample)
            if self._cpus is not None and queued_s * 4 > load_s and \
                    self.n > 2 * self._cpus and not self._deep:
                self.count = max(2, 2 * self._cpus)
                self._capped = True
            return self.count
        # Most batches only count (this runs in next()).
        self._batches += 1
        if waited:
            self._waited += 1
        self._handed += size
        if self._batches < GROW_BATCHES or not self._capped and \
                self._batches < ADAPT_BATCHES:
            return self.count
        start_t, start = self._start
        # Workers that wait for CPUs as long as a quarter of their loading
        # share the cores already: more of them would only wait longer
        # (and take the core from the consumer), so waits of next() then
        # double nothing.
        crowded = (queued_s - start.queued_s) * 4 > load_s - start.load_s
        if self._capped and self._waited * 2 >= self._batches and \
                load_s > start.load_s and not crowded:
            self.count = min(self.n, 2 * self.count)
            self._capped = self.count < self.n
            self._start = (now, sample)
            self._batches = self._waited = self._handed = 0
        elif self._batches >= ADAPT_BATCHES:
            self._capped = False
            span = now - start_t
            # What an example costs now.
            per_example = sample.per_example_since(start)
            if per_example is None:
                per_example = load_s / loaded if loaded else 0.0
            if (self._waited * 20 > self._batches and not crowded) or \
                    span <= 0:
                self.count = min(self.n, 2 * self.count)
            else:
                busy = per_example * self._handed / span
                wanted = math.ceil(busy * 1.5 - 1e-9) + 1
                # At most halved a window: one window of low demand (a
                # pause of the consumer within it) costs little.
                self.count = max(min(2, self.n), min(self.n, wanted),
                                 self.count // 2)
            self._start = (now, sample)
            self._batches = self._waited = self._handed = 0
        return self.count
