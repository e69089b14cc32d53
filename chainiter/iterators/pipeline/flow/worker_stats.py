"""``stats['worker_busy']`` and ``stats['worker_cpu_wait']``: the workers'
loading over the timed window, from the load meter (``load_meter.py``).
Pure."""

from chainiter.iterators.pipeline.flow.load_meter import ZERO


def window_mark(pool):
    """What the timed window begins with: the pool, and its meter's
    sample.  The pool itself, not its ``id``: an id may be a new pool's
    once the old one is gone."""
    return (pool, ZERO if pool is None else pool.book.meter.sample)


def worker_busy(pool, mark, span, active):
    """``(worker_busy, worker_cpu_wait)`` over the window of ``span``
    seconds (None: no window yet) that began with ``mark``: the share of
    the ``active`` workers' time spent loading (waits for a CPU
    included), and the share of that spent waiting for a CPU; None
    before the window or any loading."""
    if pool is None or span is None:
        return None, None
    marked, start = mark
    if marked is not pool:      # a new pool since the window began
        start = ZERO
    now = pool.book.meter.sample
    loaded = now.load_s - start.load_s
    queued = now.queued_s - start.queued_s
    if span <= 0:
        return None, None
    busy = min(1.0, (loaded + queued) / (max(active, 1) * span))
    return busy, (queued / (loaded + queued) if loaded + queued > 0
                  else None)
