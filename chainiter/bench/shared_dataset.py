"""``python -m chainiter.bench.shared_dataset``: the memory and start-up of
MultiprocessIterator's workers for a dataset that holds one large array.

Every example reads its own stretch of the array, so one epoch reads all
of it.  After the epoch the script prints, from ``/proc/<pid>/smaps_rollup``,
the RSS and PSS of the main process and the sum over the workers, the main
process's peak RSS (VmHWM), and the time from building the iterator to its
first batch.  Run it once per start method; figures, not assertions.
"""

import argparse
import json
import os
import tempfile
import time

import numpy

import chainiter

_CHUNKS = 64


class BigArray:
    """Example i is the sum of the i-th of 64 stretches of ``data``."""

    def __init__(self, mib, memmap_dir=None, shared=False):
        if shared:      # made in shared memory: the workers map it too
            self.data = chainiter.shared_empty(mib * 2 ** 20 // 8)
            self.data[...] = 1.0
            return
        self.data = numpy.ones(mib * 2 ** 20 // 8, dtype=numpy.float64)
        if memmap_dir is not None:     # the array as a file, mapped
            path = os.path.join(memmap_dir, 'data.npy')
            numpy.save(path, self.data)
            self.data = numpy.load(path, mmap_mode='r')

    def __len__(self):
        return _CHUNKS

    def __getitem__(self, i):
        n = len(self.data) // _CHUNKS
        return float(self.data[i * n:(i + 1) * n].sum())


def _rollup(pid):
    """{'Rss': kB, 'Pss': kB} of a process."""
    out = {}
    with open('/proc/{}/smaps_rollup'.format(pid)) as f:
        for line in f:
            key, _, rest = line.partition(':')
            if key in ('Rss', 'Pss'):
                out[key] = int(rest.split()[0])
    return out


def _peak_kb():
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM:'):
                return int(line.split()[1])
    return 0


def _descendants(pid):
    """The pids of every live process below ``pid`` (from /proc)."""
    parents = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open('/proc/{}/stat'.format(entry)) as f:
                    fields = f.read().rsplit(')', 1)[1].split()
            except OSError:
                continue
            if fields[0] not in ('Z', 'X'):
                parents[int(entry)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        todo += children
    return found


def _name(pid):
    with open('/proc/{}/cmdline'.format(pid), 'rb') as f:
        words = f.read().split(b'\0')
    return ' '.join(w.decode(errors='replace') for w in words[1:3])[:60]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--mib', type=int, default=200)
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--method', default='spawn',
                        choices=['fork', 'forkserver', 'spawn'])
    parser.add_argument('--memmap', action='store_true',
                        help='load the array with numpy.load(mmap_mode="r") '
                        'from a temporary file')
    parser.add_argument('--shared', action='store_true',
                        help='make the array with chainiter.shared_empty')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        measure(args, BigArray(args.mib, tmp if args.memmap else None,
                               args.shared))


def measure(args, dataset):
    start = time.perf_counter()
    with chainiter.MultiprocessIterator(
            dataset, 8, n_processes=args.workers, shuffle=False,
            start_method=args.method) as it:
        next(it)
        first_s = time.perf_counter() - start
        for _ in range(_CHUNKS // 8 - 1):     # the rest of the epoch
            next(it)
        main_mem = _rollup(os.getpid())
        others = {pid: (_name(pid), _rollup(pid))
                  for pid in _descendants(os.getpid())}
    mib = 1024.0
    print(json.dumps({
        'method': args.method, 'array_mib': args.mib,
        'memmap': args.memmap, 'shared': args.shared,
        'workers': args.workers,
        'first_batch_s': round(first_s, 3),
        'main_rss_mib': round(main_mem['Rss'] / mib, 1),
        'main_pss_mib': round(main_mem['Pss'] / mib, 1),
        'main_peak_rss_mib': round(_peak_kb() / mib, 1),
        'children_rss_mib': round(sum(
            m['Rss'] for _, m in others.values()) / mib, 1),
        'children_pss_mib': round(sum(
            m['Pss'] for _, m in others.values()) / mib, 1),
        'tree_pss_mib': round((main_mem['Pss'] + sum(
            m['Pss'] for _, m in others.values())) / mib, 1),
        'children_pss': ['{} {}: {:.1f} MiB'.format(pid, name, m['Pss'] / mib)
                         for pid, (name, m) in others.items()],
    }, indent=1))


if __name__ == '__main__':
    main()
