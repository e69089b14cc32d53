"""``python -m chainiter.bench``: examples/s, time to the first batch and
peak memory of chainiter's MultiprocessIterator, side by side with a plain
serial loop and (``--compare torch,grain``) PyTorch's and Grain's
DataLoaders.

Every measurement runs in a fresh process; loaders interleave and every
measurement repeats (the table shows medians, and the spread of each row's
repeats), because machines are noisy; repeats that disagree by more than
``SPREAD_LIMIT`` end the run with a warning naming their rows.

``main CPU us/batch`` is the main process's CPU per batch that the loader
spends: its main thread inside ``next()`` and every other thread of the
process (chainiter's receiver thread, DataLoader's pin-memory thread),
from the threads' own CPU clocks (``runner.MainCpu``); on a machine of
many cores the main process is what saturates first.  ``--json PATH``
writes every row and each of its runs.
"""

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import time

import numpy

from chainiter.bench import runner, workloads

DEFAULT_LOADERS = ['chainiter', 'chainiter-list', 'serial']
#: Repeats of a row whose spread ((max - min) / median of examples/s) is
#: over this get a warning: a user on a busy machine got 0.8x and 1.46x
#: from two runs.
SPREAD_LIMIT = 0.2
#: The peers --compare runs, and how to install the release measured.
PEERS = {'torch': 'pip install torch==2.13.0',
         'grain': 'pip install grain==0.2.18 (Python 3.11 or newer)'}


def memcpy_bandwidth(n_bytes=256 * 2 ** 20, repeats=5):
    """Single-copy bandwidth of this machine in bytes/s (best of a few
    copies between two preallocated, already touched buffers)."""
    src = numpy.ones(n_bytes, dtype=numpy.uint8)
    dst = numpy.zeros_like(src)
    best = float('inf')
    for _ in range(repeats):
        t = time.perf_counter()
        numpy.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return n_bytes / best


def example_bytes(workload):
    dataset = workload.make()
    sample = [dataset[i] for i in range(min(len(dataset), 256))]

    def size(x):
        if isinstance(x, (tuple, list)):
            return sum(size(v) for v in x)
        if isinstance(x, dict):
            return sum(size(v) for v in x.values())
        return numpy.asarray(x).nbytes
    return sum(size(e) for e in sample) / len(sample)


def run_one(loader, workload, workers, seconds, warmup, batch_size):
    cmd = [sys.executable, '-m', 'chainiter.bench.runner', loader, workload,
           str(workers), str(seconds), str(warmup), str(batch_size or 0)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError('{} on {} failed:\n{}'.format(
            loader, workload, out.stderr[-3000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def _worker_counts(text):
    counts = [w.strip() for w in text.split(',')]
    if not all(w.isdigit() and int(w) > 0 for w in counts):
        raise ValueError('--workers takes comma-separated positive integers, '
                         'e.g. 1,2,4; got {!r}'.format(text))
    return [int(w) for w in counts]


def _peers(values):
    """The peers of ``--compare`` (each given comma-separated or repeated),
    each once, in order."""
    peers = [p.strip() for value in values for p in value.split(',')]
    for peer in peers:
        if peer not in PEERS:
            raise ValueError(
                'unknown peer {!r}: --compare takes {}, comma-separated or '
                'repeated, e.g. --compare torch,grain'.format(
                    peer, ', '.join(PEERS)))
    return list(dict.fromkeys(peers))


def parse_args(argv=None):
    """The arguments, every one checked: a wrong one ends the program with
    status 2 and one line saying what was wrong and the right form, before
    anything runs."""
    parser = argparse.ArgumentParser(
        prog='python -m chainiter.bench', description=__doc__.split('\n\n')[0])
    parser.add_argument('--workloads', default=None,
                        help='comma-separated built-in workloads, of {} '
                             '(default: all of them, none when --dataset '
                             'is given)'.format(
                                 ', '.join(workloads.WORKLOADS)))
    parser.add_argument('--dataset', action='append', default=[],
                        help='your own workload: module:function returning '
                             'a dataset (repeatable)')
    parser.add_argument('--batch-size', type=int, default=None,
                        help='override the batch size (default: each '
                             'workload\'s own, 32 for --dataset)')
    parser.add_argument('--workers', default='2',
                        help='comma-separated worker counts, e.g. 1,2,4 '
                             '(default: %(default)s)')
    parser.add_argument('--loaders', default=','.join(DEFAULT_LOADERS),
                        help='comma-separated; chainiter and chainiter-list '
                             '(a list of examples, the consumer converts) '
                             'run at the defaults (the self-tuning depth); '
                             'chainiter:K keeps K batches per worker in '
                             'flight, torch:K is DataLoader with '
                             'prefetch_factor=K, grain:K Grain\'s with '
                             'worker_buffer_size=K; a :K row is compared '
                             'with torch:K and grain:K when they run too; '
                             'chainiter and chainiter-list also take '
                             'MultiprocessIterator arguments ({}) as '
                             'key=value separated by +, after K if any, '
                             'e.g. chainiter:n_prefetch=4+shared_mem=8000 '
                             '(default: %(default)s)'.format(
                                 ', '.join(runner.ITERATOR_ARGUMENTS)))
    parser.add_argument('--compare', action='append', default=[],
                        metavar='PEERS',
                        help='also run these peers at their defaults, of {} '
                             '(comma-separated or repeated)'.format(
                                 ', '.join(PEERS)))
    parser.add_argument('--repeats', type=int, default=3,
                        help='runs of each loader (default: %(default)s)')
    parser.add_argument('--seconds', type=float, default=3.0,
                        help='measured time per run, after warm-up '
                             '(default: %(default)s)')
    parser.add_argument('--warmup', type=float, default=1.0,
                        help='seconds of warm-up per run (default: '
                             '%(default)s)')
    parser.add_argument('--json', default=None, metavar='PATH',
                        help='also write the rows (medians, spread) and '
                             'each of their runs as JSON to PATH')
    parser.add_argument('--smoke', action='store_true',
                        help='a quick check that everything runs (tiny '
                             'durations, one repeat); its figures mean '
                             'nothing')
    args = parser.parse_args(argv)
    try:
        _check(args)
    except ValueError as e:
        parser.exit(2, '{}: error: {}\n'.format(parser.prog, e))
    return args


def _check(args):
    """Completes ``args`` (names, loaders, worker_counts); ``ValueError``
    for the first argument that is wrong."""
    if args.smoke:
        args.repeats, args.seconds, args.warmup = 1, 0.05, 0.0
    if args.workloads is None:
        # Your own dataset alone, unless you also ask for built-ins.
        args.workloads = '' if args.dataset else ','.join(workloads.WORKLOADS)
    args.names = [w for w in args.workloads.split(',') if w] + args.dataset
    if not args.names:
        raise ValueError('nothing to run: pass --workloads with some of {}, '
                         'or --dataset module:function'.format(
                             ', '.join(workloads.WORKLOADS)))
    for name in args.workloads.split(','):
        if name:
            workloads.check(name)
    for spec in args.dataset:
        workloads.user_function(spec)
    # Each once, in order: a loader also given as --compare runs once.
    args.compare = _peers(args.compare)
    args.loaders = list(dict.fromkeys(
        [x for x in args.loaders.split(',') if x] + args.compare))
    if not args.loaders:
        raise ValueError('--loaders is empty: pass some of {}'.format(
            ', '.join(runner.LOADERS)))
    for loader in args.loaders:
        runner.parse_loader(loader)
    args.worker_counts = _worker_counts(args.workers)
    if args.batch_size is not None and args.batch_size <= 0:
        raise ValueError('--batch-size takes a positive integer, got '
                         '{}'.format(args.batch_size))
    if args.repeats <= 0:
        raise ValueError('--repeats takes a positive integer, got '
                         '{}'.format(args.repeats))
    if not args.seconds > 0 or not args.warmup >= 0:
        raise ValueError('--seconds takes a positive number and --warmup '
                         'zero or more, got {} and {}'.format(
                             args.seconds, args.warmup))
    for peer, install in PEERS.items():
        if any(loader.partition(':')[0] == peer
               for loader in args.loaders):
            try:
                importlib.import_module(peer)
            except ImportError as e:
                raise ValueError('the {} loaders need {} ({}): {}'.format(
                    peer, peer, e, install)) from None


def main(argv=None):
    args = parse_args(argv)
    names, loaders, worker_counts = \
        args.names, args.loaders, args.worker_counts
    bandwidth = memcpy_bandwidth(2 ** 24 if args.smoke else 2 ** 28)
    print('memcpy bandwidth: {:.1f} GB/s (single copy)'.format(
        bandwidth / 1e9), file=sys.stderr)
    # Where a peer cannot express a workload, it says why and skips it.
    skipped = {}
    for w in names:
        workload = workloads.get(w, args.batch_size)
        for loader in loaders:
            reason = runner.unsupported(loader, workload)
            if reason:
                skipped[w, loader] = reason
                print('skipping {} on {}: {}'.format(loader, w, reason),
                      file=sys.stderr)
    runs = [(w, n, loader) for w in names for n in worker_counts
            for loader in loaders if not (loader == 'serial' and n !=
                                          worker_counts[0])
            and (w, loader) not in skipped]
    results = {}
    total = len(runs) * args.repeats
    done = 0
    for rep in range(args.repeats):
        for workload, workers, loader in runs:   # interleaved repeats
            done += 1
            r = run_one(loader, workload, 0 if loader == 'serial' else
                        workers, args.seconds, args.warmup, args.batch_size)
            results.setdefault((workload, workers, loader), []).append(r)
            print('[{:3d}/{}] {:10s} {:15s} workers={} rep {}: {:>10,.0f} '
                  'examples/s'.format(done, total, workload, loader, workers,
                                      rep + 1, r['examples_per_s']),
                  file=sys.stderr, flush=True)
    print(format_table(results, names, worker_counts, loaders, bandwidth))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(json_rows(results), f, indent=1)
    for (w, loader), reason in skipped.items():
        print('{} did not run {}: {}'.format(loader, w, reason))
    # With the table, so that a saved table carries it.
    warning = spread_warning(results)
    if warning:
        print(warning)


#: The figures of a run that a row gives as medians.
MEDIANS = ('examples_per_s', 'first_batch_s', 'peak_pss_bytes',
           'main_cpu_us_per_batch', 'main_thread_cpu_us_per_batch',
           'other_threads_cpu_us_per_batch')


def json_rows(results):
    """``--json``'s list: a row for each (workload, workers, loader) of
    ``results``, the medians of its runs' figures, the spread of their
    examples/s, and the runs."""
    rows = []
    for (workload, workers, loader), runs in results.items():
        row = {'workload': workload, 'workers': workers, 'loader': loader}
        for key in MEDIANS:
            values = [r[key] for r in runs if r.get(key) is not None]
            row[key] = statistics.median(values) if values else None
        row['spread'] = spread([r['examples_per_s'] for r in runs])
        row['runs'] = runs
        rows.append(row)
    return rows


def spread(rates):
    """How far repeats disagree: (max - min) / median; 0 for one."""
    return (max(rates) - min(rates)) / statistics.median(rates)


def spread_warning(results, limit=SPREAD_LIMIT):
    """A warning naming the rows of ``results`` (``{(workload, workers,
    loader): [run, ...]}``) whose repeats' examples/s disagree by more
    than ``limit``, or ``None`` when none do."""
    rows = []
    for (workload, workers, loader), runs in results.items():
        rates = [r['examples_per_s'] for r in runs]
        if spread(rates) > limit:
            rows.append('{}, {} workers, {} ({:.0f}%)'.format(
                workload, 0 if loader == 'serial' else workers, loader,
                100 * spread(rates)))
    if not rows:
        return None
    return ('warning: the repeats of {} disagree by more than {:.0f}% '
            '((max - min) / median of examples/s): {}. The machine was '
            'probably busy; rerun on a quiet machine or with more '
            '--repeats.'.format(
                'this row' if len(rows) == 1 else 'these rows',
                100 * limit, '; '.join(rows)))


def format_table(results, names, worker_counts, loaders, bandwidth):
    lines = []
    # 'vs torch' always (the first peer); another peer's column when it ran.
    peers = [p for p in PEERS if p == 'torch' or any(
        loader.partition(':')[0] == p for loader in loaders)]
    header = (('workload', 'workers', 'loader', 'examples/s') +
              tuple('vs ' + p for p in peers) +
              ('vs serial', '% memcpy', 'first batch s', 'peak PSS MiB',
               'main CPU us/batch', 'spread'))
    lines.append('| ' + ' | '.join(header) + ' |')
    lines.append('|' + '|'.join('---' for _ in header) + '|')
    for workload in names:
        ceiling = bandwidth / example_bytes(workloads.get(workload))
        for workers in worker_counts:
            def runs(loader, workload=workload, workers=workers):
                return results.get((workload, workers, loader)) or \
                    results.get((workload, worker_counts[0], loader))

            def median(loader, key):
                values = [r[key] for r in runs(loader) or ()
                          if r.get(key) is not None]
                if not values:
                    return None
                return statistics.median(values)
            serial_rate = median('serial', 'examples_per_s')
            for loader in loaders:
                if loader == 'serial' and workers != worker_counts[0]:
                    continue
                rate = median(loader, 'examples_per_s')
                if rate is None:        # a peer that skipped this workload
                    continue
                # Like with like: a deeper pipeline against a DataLoader
                # as deep, when that ran; other arguments against the
                # peers' defaults.
                depth = runner.parse_loader(loader)[1]
                ratios = []
                for p in peers:
                    peer = '{}:{}'.format(p, depth)
                    if not depth or peer not in loaders:
                        peer = p
                    peer_rate = median(peer, 'examples_per_s')
                    ratios.append('{:.2f}x'.format(rate / peer_rate)
                                  if peer_rate else '-')
                lines.append('| ' + ' | '.join([
                    workload, str(0 if loader == 'serial' else workers),
                    loader, '{:,.0f}'.format(rate)] + ratios + [
                    '{:.2f}x'.format(rate / serial_rate) if serial_rate
                    else '-',
                    '{:.0f}%'.format(100 * rate / ceiling),
                    '{:.2f}'.format(median(loader, 'first_batch_s')),
                    '{:.0f}'.format(median(loader, 'peak_pss_bytes')
                                    / 2 ** 20),
                    _us(median(loader, 'main_cpu_us_per_batch')),
                    '-' if len(runs(loader)) == 1 else '{:.0f}%'.format(
                        100 * spread([r['examples_per_s']
                                      for r in runs(loader)]))]) + ' |')
    return '\n'.join(lines)


def _us(value):
    return '-' if value is None else '{:.1f}'.format(value)


if __name__ == '__main__':
    main()
