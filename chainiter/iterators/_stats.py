"""Is training waiting for data?  ``iterator.stats`` and ``diagnose``.

::

    next(): t0 ── waits for the batch ── t1 ─► user computes ─► next(): t0
            └───────── wait_s ──────────┘      (elapsed_s - wait_s)

Every ``next()`` that hands out a batch reads the clock twice
(``time.perf_counter``) and adds to a few counters; nothing else runs per
batch.  The first batch (which starts workers and sizes buffers) is timed
apart (``first_batch_s``); the window for ``wait_s``, ``elapsed_s``,
``wait_fraction`` and ``examples_per_s`` starts when it is handed out (or
at ``reset_stats()``).  ``diagnose(it)`` reads the dict and says in one
line whether the loop is input-bound or compute-bound; the verdict itself
is ``judge``, a pure function of the figures.
"""

import math
import time
from typing import Any, Dict

from chainiter._cpus import usable_cpus

#: ``diagnose`` calls a loop input-bound when next() waited at least this
#: fraction of the time.
INPUT_BOUND_FRACTION = 0.1

#: Below this many timed batches ``diagnose`` does not judge.
MIN_BATCHES = 2

#: A MultiprocessIterator's workers count as saturated from this busy
#: fraction on (more workers help); below it the time goes elsewhere.
SATURATED_FRACTION = 0.75

#: When the workers waited for a CPU at least this share of their busy
#: time while fewer of them ran than there are CPUs, other processes took
#: the CPUs: the figures follow the machine's load, and ``diagnose`` says
#: they are too noisy instead of advising.
NOISY_CPU_WAIT = 0.5


class Timing:
    """The counters of one iterator.  A copy or unpickled iterator starts
    with fresh ones."""

    __slots__ = ('batches', 'examples', 'first_batch_s', 'since', 'last',
                 'wait_s', 'timed_batches', 'timed_examples')

    def __init__(self, since=None):
        self.batches = 0
        self.examples = 0
        self.first_batch_s = None
        self.since = since          # the window's start, or None
        self.last = since
        self.wait_s = 0.0
        self.timed_batches = 0
        self.timed_examples = 0

    def count(self, started, before, after, dataset_len, ranks=1):
        """A batch handed out: ``next()`` began at ``started`` and moved
        the state from ``before`` to ``after`` (by a global batch shared by
        ``ranks`` ranks, of which this one got its even share, rounded up as
        a sharded iterator pads it); True when the window starts with it."""
        now = time.perf_counter()
        examples = after.current_position - before.current_position
        if after.epoch != before.epoch:
            examples += (after.epoch - before.epoch) * (
                dataset_len() if before.order is None else len(before.order))
        examples = -(-examples // ranks)
        self.batches += 1
        self.examples += examples
        self.last = now
        if self.since is None:      # the first batch: start-up, apart
            self.first_batch_s = now - started
            self.since = now
            return True             # the window starts
        self.wait_s += now - started
        self.timed_batches += 1
        self.timed_examples += examples
        return False

    def as_dict(self):
        elapsed = 0.0 if self.since is None else self.last - self.since
        timed = self.timed_batches
        return {
            'batches': self.batches,
            'examples': self.examples,
            'first_batch_s': self.first_batch_s,
            'wait_s': self.wait_s,
            'wait_mean_s': self.wait_s / timed if timed else 0.0,
            'elapsed_s': elapsed,
            'wait_fraction': self.wait_s / elapsed if elapsed > 0 else 0.0,
            'examples_per_s': self.timed_examples / elapsed
            if elapsed > 0 else 0.0,
            'timed_batches': timed,
        }


class InputStats:
    """What ``DatasetIterator`` gets for ``stats``; transports add keys by
    overriding ``stats`` and the hooks."""

    _timing: Timing

    def _count_batch(self, started, before, after):
        """Called by ``__next__`` for each batch handed out."""
        shard = getattr(self, '_shard', None)
        if self._timing.count(started, before, after, self._dataset_len,
                              1 if shard is None else shard.size):
            self._stats_window_started()

    def _dataset_len(self):
        return len(self.dataset)

    def _stats_window_started(self):
        """The timed window starts now (a transport may note its own
        counters)."""

    def _ready_batches(self):
        """Batches loaded ahead and ready to hand out (0: none are)."""
        return 0

    @property
    def stats(self) -> Dict[str, Any]:
        """How the loop went, as a dict (see docs/tuning.rst):
        ``batches`` and ``examples`` handed out; ``first_batch_s``, the
        seconds of the first ``next()``; over the window after it:
        ``wait_s`` (seconds inside ``next()``), ``wait_mean_s`` (per
        batch), ``elapsed_s``, ``wait_fraction`` (``wait_s / elapsed_s``),
        ``examples_per_s``, ``timed_batches``; and ``ready``, batches
        loaded and waiting now."""
        stats = self._timing.as_dict()
        stats['ready'] = self._ready_batches()
        return stats

    def reset_stats(self) -> None:
        """Zero the counters; the timed window starts now (e.g. after a
        warm-up, or an evaluation that is not part of the loop)."""
        self._timing = Timing(time.perf_counter())
        self._stats_window_started()


def diagnose(iterator: Any,
             threshold: float = INPUT_BOUND_FRACTION) -> str:
    """One line: is the loop over ``iterator`` input-bound or
    compute-bound?  Read from ``iterator.stats``; call it after some
    batches (e.g. at the end of an epoch).

    Input-bound when ``next()`` waited at least ``threshold`` of the time;
    the line then says what would help (see ``judge``).
    """
    converter = getattr(iterator, 'converter', None)
    return judge(
        iterator.stats, usable_cpus(), threshold,
        n_processes=getattr(iterator, 'n_processes', None),
        n_threads=getattr(iterator, 'n_threads', None),
        converter_in_main=converter is not None and not getattr(
            iterator, '_stacked', False) and not getattr(
                iterator, '_in_workers', False))


def judge(stats, cpus, threshold=INPUT_BOUND_FRACTION, n_processes=None,
          n_threads=None, converter_in_main=False):
    """The verdict of ``diagnose`` from the figures alone: ``stats`` (an
    iterator's), the CPUs available, and what loads (``n_processes``
    workers, ``n_threads`` threads, or neither: the main thread).

    For workers it goes by what they did, over the active ones
    (``worker_busy``, ``worker_cpu_wait``):

    - busy at least ``SATURATED_FRACTION``: they are the limit; more of
      them, up to the CPUs;
    - less, with most batches by copy, or a converter in the main
      process: the main process is;
    - less, with fewer than two tasks in flight for each active worker:
      the pipeline is too shallow (``n_prefetch``);
    - less, with tasks enough: what a worker does around ``dataset[i]``
      (messages, small tasks) is not timed as busy, but it is the workers'
      work all the same: more of them;
    - waits for a CPU of at least ``NOISY_CPU_WAIT`` of their busy time,
      with fewer workers than CPUs: other processes took the CPUs, and the
      figures would change with the load: too noisy to advise.
    """
    if stats.get('timed_batches', 0) < MIN_BATCHES or \
            stats['elapsed_s'] <= 0:
        return ('not enough batches to judge yet ({} handed out); call '
                'diagnose() after a few more'.format(stats['batches']))
    waited = stats['wait_fraction']
    head = 'next() waited {:.0%} of the time ({:.3g} ms a batch, {:.4g} ' \
        'examples/s)'.format(min(waited, 1.0), stats['wait_mean_s'] * 1e3,
                             stats['examples_per_s'])
    if waited < threshold:
        return 'compute-bound: {}; the loader is not the bottleneck'.format(
            head)
    if n_processes is not None:
        advice = _workers_advice(stats, cpus, n_processes, converter_in_main)
    elif n_threads is not None:
        advice = ('try n_threads={} (or MultiprocessIterator(n_processes={}) '
                  'when dataset[i] holds the GIL)'.format(
                      _more_workers(n_threads, waited, 4 * cpus),
                      _more_workers(1, waited, cpus)))
    else:
        advice = 'try MultiprocessIterator(n_processes={})'.format(
            _more_workers(1, waited, max(cpus, 2)))
    return 'input-bound: {}; {}'.format(head, advice)


def _more_workers(current, waited, cpus):
    """Workers that would keep up: the loader must get ``1 / (1 -
    waited)`` times faster."""
    computing = max(1.0 - min(waited, 1.0), 1e-3)
    return min(max(current + 1, math.ceil(current / computing)), cpus)


def _workers_advice(stats, cpus, n_processes, converter_in_main):
    waited = stats['wait_fraction']
    busy = stats.get('worker_busy')
    cpu_wait = stats.get('worker_cpu_wait') or 0.0
    active = min(stats.get('workers_active') or n_processes, n_processes)
    if busy is not None and cpu_wait >= NOISY_CPU_WAIT and active < cpus:
        return ('but the measurement is too noisy to advise on: the '
                'workers waited for a CPU {:.0%} of their busy time, so '
                'other processes took the CPUs and the figures change with '
                'the machine\'s load; measure again when it is '
                'quieter'.format(cpu_wait))
    if busy is not None and busy < SATURATED_FRACTION:
        batches = max(stats['batches'], 1)
        by_copy = stats.get('by_copy', 0)
        prefetch = stats.get('prefetch', 1)
        tasks = prefetch / max(stats.get('batches_per_task') or 1, 1)
        idle = 'but the workers were busy only {:.0%} of the time: '.format(
            busy)
        if converter_in_main:
            return idle + ('the main process is the bottleneck, running '
                           'the converter: pass converter_in_workers=True '
                           '(or converter=concat_examples)')
        if by_copy * 2 >= batches:
            return idle + ('the main process is the bottleneck, copying '
                           'batches ({} of {} by copy): let go of each '
                           'batch before the next next(), and pass '
                           'converter=concat_examples'.format(
                               by_copy, stats['batches']))
        if tasks < 2 * active:
            return idle + ('the pipeline is too shallow ({} batches in '
                           'flight for {} workers): try n_prefetch={}'.format(
                               prefetch, active, 2 * prefetch))
    if n_processes >= cpus:
        return ('the {} workers use every CPU available: make '
                'dataset[i] cheaper (or load on more machines)'.format(
                    n_processes))
    return 'try n_processes={}'.format(
        _more_workers(n_processes, waited, cpus))
