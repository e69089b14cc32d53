"""``python -m chainiter.bench.scale``: how a loader's costs grow with the
length of the dataset.

For datasets of N trivial examples (example ``i`` is ``i``), batch 256,
shuffled, 2 fork workers, each figure in a fresh process (medians of the
repeats), it prints:

- construct: building the loader;
- boundary: the slowest ``next()`` of the 8 batches on each side of an
  epoch boundary, against the median ``next()`` there, with a 2 ms training
  step between batches (chainiter jumps to 56 batches before the end
  with a snapshot and takes 48 untimed, while its pipeline refills and
  its groups are chosen;
  DataLoader starts its next epoch with ``iter()``, as its epoch loop
  does).  Every loader first takes 80 batches untimed after its first:
  the first window timed after a start runs slower throughout (its
  median ``next()`` was 1.1-4x the later windows'), which would make
  its slowest call look smaller against it;
- mid-epoch: the same figure for 16 batches away from the boundary, the
  control: on a shared or virtual machine a ``next()`` of 0.1 ms varies
  by 2x or more anyway (a Python loop of the same length does too), and
  a boundary that costs nothing shows the same ratio as the control;
- less CPU waits: both ratios again with each ``next()`` less the time
  the main thread waited for a CPU in it (Linux's schedstat run-queue
  wait): with 2 workers on 2 cores the slowest calls are mostly those
  waits, not the loader's work;
- extra memory: how much the main process's RSS grew across the boundary;
- tree PSS: the memory of the main process and its workers together, after
  the boundary;
- snapshot: the compressed size of the loader's state, the time to save
  it, and to resume from it: a new loader of 2 workers made and given the
  state, its workers started (chainiter: ``save_npz``, then the
  constructor and ``load_npz``; torchdata's ``StatefulDataLoader``, where
  installed: ``state_dict()`` pickled into an npz, then read back, the
  constructor, ``load_state_dict()`` and ``iter()``, which applies the
  state and starts the workers; DataLoader has no state).

``--compare torch`` adds PyTorch's DataLoader (and torchdata's
StatefulDataLoader where installed).
"""

import argparse
import gc
import io
import json
import os
import pickle
import statistics
import subprocess
import sys
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
    from chainiter.iterators.multiprocess.worker import RunQueueClock
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


def run_one(loader, n):
    cmd = [sys.executable, '-m', 'chainiter.bench.scale', '--one', loader,
           str(n)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError('{} at N={} failed:\n{}'.format(
            loader, n, done.stderr[-3000:]))
    return json.loads(done.stdout.strip().splitlines()[-1])


def _loaders(compare):
    loaders = ['chainiter']
    if 'torch' in compare:
        try:
            import torch  # noqa: F401
        except ImportError:
            sys.exit('--compare torch: torch is not installed (pip install '
                     'torch)')
        loaders.append('torch')
        try:
            import torchdata.stateful_dataloader  # noqa: F401
            loaders.append('torch-stateful')
        except ImportError:
            pass
    return loaders


def _size(text):
    try:
        value = float(text)
    except ValueError:
        value = -1
    least = 2 * (WARM + 2 * AROUND) * BATCH
    if value < least or not value.is_integer():
        raise argparse.ArgumentTypeError(
            'sizes are whole numbers of at least {} (e.g. 1e6,1e7), got '
            '{!r}'.format(least, text))
    return int(value)


def _mib(n_bytes):
    return '{:.1f} MiB'.format(n_bytes / 2 ** 20)


def _format(row):
    def ms(key):
        return '{:.1f} ms'.format(row[key] * 1e3) if key in row else '-'
    snapshot = (_mib(row['snapshot_bytes']) if row['snapshot_bytes'] >= 2 **
                20 else '{:.1f} KiB'.format(row['snapshot_bytes'] / 1024)) \
        if 'snapshot_bytes' in row else '-'
    return [ms('construct_s'),
            '{} ({:.1f}x)'.format(ms('boundary_max_s'),
                                  row['boundary_ratio']),
            '{} ({:.1f}x)'.format(ms('control_max_s'), row['control_ratio']),
            '{:.1f}x / {:.1f}x'.format(row['boundary_own_ratio'],
                                       row['control_own_ratio']),
            ms('next_median_s'), _mib(row['extra_rss']), _mib(row['tree_pss']),
            snapshot, ms('save_s'), ms('load_s')]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog='python -m chainiter.bench.scale',
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--sizes', default='1e6,1e7,1e8',
                        help='dataset lengths, comma-separated')
    parser.add_argument('--repeats', type=int, default=3,
                        help='fresh processes per figure (medians shown)')
    parser.add_argument('--compare', default='',
                        help='"torch": add DataLoader (and torchdata\'s '
                        'StatefulDataLoader where installed)')
    parser.add_argument('--one', nargs=2, metavar=('LOADER', 'N'),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        loader, n = args.one
        print(json.dumps(MEASURES[loader](int(n))))
        return
    try:
        sizes = [_size(s) for s in args.sizes.split(',')]
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    if args.repeats < 1:
        parser.error('--repeats must be at least 1')
    loaders = _loaders(args.compare)
    header = ['loader', 'N', 'construct', 'slowest next() at the boundary '
              '(x median)', 'slowest next() mid-epoch (x median)',
              'the same less CPU waits, boundary / mid-epoch',
              'median next()', 'extra memory', 'tree PSS',
              'snapshot', 'save', 'resume']
    print(' | '.join(header))
    print(' | '.join('---' for _ in header))
    for n in sizes:
        runs = {loader: [] for loader in loaders}
        for _ in range(args.repeats):
            for loader in loaders:       # interleaved
                runs[loader].append(run_one(loader, n))
        for loader in loaders:
            row = {key: statistics.median(r[key] for r in runs[loader])
                   for key in runs[loader][0]}
            print(' | '.join([loader, '{:.0e}'.format(n)] + _format(row)),
                  flush=True)


if __name__ == '__main__':
    main()
