"""What one fresh process of ``python -m chainiter.bench.scale`` measures
for one loader and one dataset length (``MEASURES``): the construction, the
slowest ``next()`` at an epoch boundary and mid-epoch, the memory, and the
snapshot's size, save and resume (scale.py's docstring says how)."""

import gc
import io
import os
import pickle
import statistics
import time

import numpy


BATCH = 256
WORKERS = 2
AROUND = 8        # batches measured on each side of the boundary
# Untimed batches after a jump: the pipeline refills, and chainiter
# chooses its groups (after GROUP_AFTER = 32 batches: a choice that would
# otherwise fall on the boundary).
WARM = 48
STEP_S = 0.002    # a training step between batches (the GPU's turn)


class Trivial:
    """N examples; example ``i`` is ``numpy.int64(i)``: nothing stored."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return numpy.int64(i)


def _rss_bytes():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def _tree_pss():
    from chainiter.bench.runner import descendants, pss_bytes
    return sum(pss_bytes(pid) for pid in descendants(os.getpid()))


class Timed(list):
    """Seconds of each timed ``next()``, and in ``own`` the same less the
    time the main thread waited for a CPU meanwhile (the run-queue wait of
    Linux's schedstat; 0 elsewhere)."""

    def __init__(self):
        super().__init__()
        self.own = []

    def __add__(self, other):
        both = Timed()
        both.extend(list(self) + list(other))
        both.own = self.own + other.own
        return both


def _timed_nexts(it, count, first_s=None):
    """Time ``count`` calls of ``next(it)``, each after a training step, so
    that a loader keeping up shows only its own cost in ``next()``.
    ``first_s``: the first is already timed (it took that long)."""
    from chainiter.iterators.pipeline.pool.load import RunQueueClock
    run_queue = RunQueueClock()
    times = Timed()
    if first_s is not None:
        times.append(first_s)
        times.own.append(first_s)
        count -= 1
    for _ in range(count):
        time.sleep(STEP_S)
        waited = run_queue()
        t = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - t)
        times.own.append(times[-1] - (run_queue() - waited))
    return times


def _warm_up(it, position):
    """Take as many batches untimed as a timed window of chainiter
    takes (after a jump to ``position``), so that no timed window is the
    first after the start."""
    state = it.state_dict()
    state['current_position'] = position
    it.load_state_dict(state)
    _timed_nexts(it, WARM + 2 * AROUND)


def _slowest(out, name, times):
    """The slowest of ``times`` in ``out`` as ``name_max_s`` and against
    their median as ``name_ratio``; ``name_own_ratio``: the same less the
    waits for a CPU."""
    out[name + '_max_s'] = max(times)
    out[name + '_ratio'] = max(times) / statistics.median(times)
    out[name + '_own_ratio'] = max(times.own) / statistics.median(times.own)


def measure_chainiter(n):
    import chainiter
    from chainiter.serializers import load_npz, save_npz
    out = {}
    t = time.perf_counter()
    it = chainiter.MultiprocessIterator(
        Trivial(n), BATCH, n_processes=WORKERS, seed=0, start_method='fork',
        converter=chainiter.concat_examples)
    out['construct_s'] = time.perf_counter() - t
    with it:
        next(it)
        _warm_up(it, n // 4 // BATCH * BATCH)
        state = it.state_dict()
        state['current_position'] = n - (WARM + AROUND) * BATCH
        it.load_state_dict(state)
        # The bench's own collection first: the next() right after it
        # runs with cold caches, whatever the loader.
        gc.collect()
        # While the pipeline refills after the jump, its workers take the
        # cores from the main process: not what a boundary costs.
        _timed_nexts(it, WARM)
        rss = _rss_bytes()
        before = _timed_nexts(it, AROUND)
        after = _timed_nexts(it, AROUND)
        assert it.epoch == 1
        out['next_median_s'] = statistics.median(before + after)
        _slowest(out, 'boundary', before + after)
        out['extra_rss'] = _rss_bytes() - rss
        out['tree_pss'] = _tree_pss()
        state = it.state_dict()
        state['current_position'] = n // 2 // BATCH * BATCH
        it.load_state_dict(state)
        _timed_nexts(it, WARM)
        _slowest(out, 'control', _timed_nexts(it, 2 * AROUND))
        f = io.BytesIO()
        t = time.perf_counter()
        save_npz(f, it)
        out['save_s'] = time.perf_counter() - t
        out['snapshot_bytes'] = len(f.getvalue())
    gc.collect()            # as before the torch loaders' resume
    f.seek(0)
    t = time.perf_counter()
    other = chainiter.MultiprocessIterator(
        Trivial(n), BATCH, n_processes=WORKERS, seed=0, start_method='fork',
        converter=chainiter.concat_examples)
    with other:
        load_npz(f, other)
        out['load_s'] = time.perf_counter() - t
    return out


def measure_torch(n, stateful=False):
    import torch.utils.data
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader as make
    else:
        make = torch.utils.data.DataLoader
    out = {}
    t = time.perf_counter()
    loader = make(Trivial(n), BATCH, shuffle=True, num_workers=WORKERS,
                  persistent_workers=True,
                  multiprocessing_context='fork')
    out['construct_s'] = time.perf_counter() - t
    it = iter(loader)
    next(it)
    gc.collect()
    _timed_nexts(it, WARM + 2 * AROUND)     # as _warm_up
    _timed_nexts(it, WARM)
    rss = _rss_bytes()
    before = _timed_nexts(it, AROUND)
    # The next epoch, as `for epoch ...: for batch in loader` starts it.
    t = time.perf_counter()
    it = iter(loader)
    next(it)
    after = _timed_nexts(it, AROUND, first_s=time.perf_counter() - t)
    out['next_median_s'] = statistics.median(before + after)
    _slowest(out, 'boundary', before + after)
    out['extra_rss'] = _rss_bytes() - rss
    out['tree_pss'] = _tree_pss()
    _timed_nexts(it, 2)
    _slowest(out, 'control', _timed_nexts(it, 2 * AROUND))
    if stateful:
        t = time.perf_counter()
        blob = pickle.dumps(loader.state_dict())
        f = io.BytesIO()
        numpy.savez_compressed(f, state=numpy.frombuffer(blob, numpy.uint8))
        out['save_s'] = time.perf_counter() - t
        out['snapshot_bytes'] = len(f.getvalue())
    del it, loader          # its workers stop, as chainiter's have
    gc.collect()
    if stateful:
        # A state of 2 workers loads only into a loader of 2 workers;
        # load_state_dict() keeps it and iter() applies it (and starts
        # the workers, as chainiter's constructor does).
        f.seek(0)
        t = time.perf_counter()
        state = pickle.loads(numpy.load(f)['state'].tobytes())
        other = make(Trivial(n), BATCH, shuffle=True, num_workers=WORKERS,
                     multiprocessing_context='fork')
        other.load_state_dict(state)
        resumed = iter(other)
        out['load_s'] = time.perf_counter() - t
        del resumed, other
    return out


MEASURES = {
    'chainiter': measure_chainiter,
    'torch': measure_torch,
    'torch-stateful': lambda n: measure_torch(n, stateful=True),
}
