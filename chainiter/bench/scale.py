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
import json
import statistics
import subprocess
import sys

from chainiter.bench.scale_measure import AROUND, BATCH, MEASURES, WARM


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
