"""One measurement in a fresh process: ``python -m chainiter.bench.runner
LOADER WORKLOAD WORKERS SECONDS`` prints one JSON line.

Loaders:
    chainiter        MultiprocessIterator at its defaults (the self-tuning
                     depth), workers stack the batch in shared memory
                     (converter=concat_examples)
    chainiter-list   MultiprocessIterator's list of examples, then the
                     workload's converter in the consumer (as Chainer's
                     StandardUpdater calls it)
    threads, threads-list
                     the same with MultithreadIterator (n_threads=WORKERS):
                     the same pipeline with worker threads
    chainiter:K, chainiter-list:K
                     the same with n_prefetch = K x workers
    chainiter:n_prefetch=4+shared_mem=8000, chainiter-list:8+...
                     the same with these MultiprocessIterator arguments
                     (n_prefetch, shared_mem, maxtasksperchild,
                     prefetch_bytes: positive integers, or None but for
                     prefetch_bytes), separated by '+', after K if any
    torch:K          DataLoader with prefetch_factor=K (as deep)
    torch            torch.utils.data.DataLoader, persistent workers,
                     default collate (the workload's padding collate for
                     'variable', 'variable-labelled' and
                     'variable-packed');
                     on 'tiny-batched' its batched path: batch_size=None,
                     a BatchSampler as the sampler, and a dataset that
                     takes the list of indices (one fancy index per array)
    grain            Grain's DataLoader (``import grain``, 0.2.18) at its
                     defaults: an IndexSampler (shuffled, endless), a
                     Batch operation (its own stacking, or the workload's
                     converter where that pads), worker_count=WORKERS;
                     per example on 'tiny-batched' too (it reads records
                     one at a time); not on workloads with their own order
                     ('bucketed': see ``unsupported``)
    grain:K          the same with worker_buffer_size=K (batches per worker)
    serial           a plain loop: index, fetch, numpy stack (per example,
                     on 'tiny-batched' too)
"""

import json
import os
import sys
import threading
import time

import numpy

from chainiter.bench import workloads
from chainiter.dataset.convert import concat_examples

_PAGE = 4096
# Memory is sampled often while loaders start and warm up (when buffers and
# workers come up), then once a second while examples/s is timed: a sample
# walks every page the process tree maps, 15-25 ms of CPU with 38 MB
# batches (chainiter's slots or DataLoader's shared tensors alike), which
# at the start-up rate would take a tenth of a 2-core machine from the
# loader being timed.
_PSS_INTERVAL_S = 0.05
_PSS_TIMED_INTERVAL_S = 1.0


def touch(batch):
    """Read one byte per 4 KiB page of every array of the batch, as a
    training step would read the data."""
    if isinstance(batch, (tuple, list)):
        return sum(touch(x) for x in batch)
    if isinstance(batch, dict):
        return sum(touch(x) for x in batch.values())
    if hasattr(batch, 'numpy') and not isinstance(batch, numpy.ndarray):
        batch = batch.numpy()
    array = numpy.asarray(batch)
    if array.size == 0:
        return 0
    if array.flags.c_contiguous:
        return int(array.reshape(-1).view(numpy.uint8)[::_PAGE].sum())
    if array.ndim and array.strides[-1] == array.itemsize:
        # A view of padded rows: read each row's pages where they lie.
        return int(array.view(numpy.uint8)[..., ::_PAGE].sum())
    return touch(numpy.ascontiguousarray(array))


def descendants(pid):
    """``pid`` and every process below it: from /proc/*/task/*/children
    (a few reads), or a scan of every process where the kernel lacks it."""
    if not os.path.exists('/proc/{0}/task/{0}/children'.format(pid)):
        return _descendants_by_scan(pid)
    out = [pid]
    i = 0
    while i < len(out):
        p = out[i]
        i += 1
        try:
            for tid in os.listdir('/proc/{}/task'.format(p)):
                with open('/proc/{}/task/{}/children'.format(p, tid)) as f:
                    out.extend(int(x) for x in f.read().split())
        except OSError:
            pass     # it has just exited
    return out


def _descendants_by_scan(pid):
    children = {}
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/{}/stat'.format(entry), 'rb') as f:
                ppid = int(f.read().rsplit(b')', 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def pss_bytes(pid):
    try:
        with open('/proc/{}/smaps_rollup'.format(pid)) as f:
            for line in f:
                if line.startswith('Pss:'):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakPss:
    """Samples the PSS summed over this process and its descendants."""

    def __init__(self):
        self.peak = 0
        self.interval = _PSS_INTERVAL_S
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def timing(self):
        """Sample seldom from now on: the loader is being timed."""
        self.interval = _PSS_TIMED_INTERVAL_S

    def sample(self):
        total = sum(pss_bytes(p) for p in descendants(os.getpid()))
        self.peak = max(self.peak, total)

    def stop(self):
        self._stop.set()
        self.thread.join()
        self.sample()
        return self.peak


#: Loader names; those marked True also take ``:K`` (batches per worker).
LOADERS = {'chainiter': True, 'chainiter-list': True, 'threads': True,
           'threads-list': True, 'torch': True, 'grain': True,
           'serial': False}
#: The chainiter loaders: MultiprocessIterator's, then MultithreadIterator's
#: (True: the list of examples, converted in the consumer).
CHAINITER = {'chainiter': False, 'chainiter-list': True,
             'threads': False, 'threads-list': True}
#: The arguments of ITERATOR_ARGUMENTS that MultithreadIterator takes.
THREAD_ARGUMENTS = ('n_prefetch', 'prefetch_bytes')
#: The MultiprocessIterator arguments a chainiter loader name can carry
#: (``chainiter:n_prefetch=4+shared_mem=8000``), and whether each takes
#: None. Each is a positive integer otherwise; the bench sets the others.
ITERATOR_ARGUMENTS = {'n_prefetch': True, 'shared_mem': True,
                      'maxtasksperchild': True, 'prefetch_bytes': False}
#: What separates the parts of a loader name after the colon: a character
#: that needs no quoting on a shell command line and is not the comma of
#: --loaders' list.
SEPARATOR = '+'
_EXAMPLE = 'chainiter:n_prefetch=4+shared_mem=8000'


def parse_loader(name):
    """``(base, K or None, arguments)`` for a loader name, ``arguments``
    the dict of MultiprocessIterator keyword arguments it carries;
    ``ValueError`` (its message says what is wrong and the right form) for
    a name that is none.

    ``NAME:K`` keeps K batches per worker in flight; a chainiter loader
    also takes ``key=value`` parts, separated by ``+`` (after K, if any):
    ``chainiter:n_prefetch=4+shared_mem=8000``, ``chainiter-list:8+
    maxtasksperchild=1000``.
    """
    base, colon, rest = name.partition(':')
    parts = rest.split(SEPARATOR) if colon else []
    factor = None
    if parts and parts[0].isdecimal() and int(parts[0]) > 0:
        factor = int(parts.pop(0))
    # After K (if any), only key=value parts, and those only for chainiter.
    well_formed = base in LOADERS and (not colon or LOADERS[base]) and all(
        '=' in part for part in parts) and (
            not parts or base in CHAINITER)
    if not well_formed:
        raise ValueError(
            'unknown loader {!r}: --loaders takes a comma-separated list of '
            '{}; {} also take NAME:K with K a positive integer (batches per '
            'worker in flight), e.g. chainiter:8, and chainiter and '
            'chainiter-list MultiprocessIterator arguments, key=value '
            'separated by {!r}, e.g. {}'.format(
                name, ', '.join(LOADERS),
                ', '.join(n for n, deep in LOADERS.items() if deep),
                SEPARATOR, _EXAMPLE))
    arguments = {}
    for part in parts:
        key, _, value = part.partition('=')
        if key not in ITERATOR_ARGUMENTS:
            raise ValueError(
                'loader {!r}: unknown argument {!r}; a chainiter loader '
                'takes {}, as key=value separated by {!r}, e.g. {}'.format(
                    name, key, ', '.join(ITERATOR_ARGUMENTS), SEPARATOR,
                    _EXAMPLE))
        if base.startswith('threads') and key not in THREAD_ARGUMENTS:
            raise ValueError(
                'loader {!r}: MultithreadIterator takes no {!r}; a threads '
                'loader takes {}'.format(name, key,
                                         ', '.join(THREAD_ARGUMENTS)))
        if key in arguments:
            raise ValueError('loader {!r}: {!r} given twice; give each '
                             'argument once, e.g. {}'.format(
                                 name, key, _EXAMPLE))
        if value == 'None' and ITERATOR_ARGUMENTS[key]:
            arguments[key] = None
        elif value.isdecimal() and int(value) > 0:
            arguments[key] = int(value)
        else:
            raise ValueError(
                'loader {!r}: {}={!r}; {} takes a positive integer{}, '
                'e.g. {} (arguments are separated by {!r})'.format(
                    name, key, value, key,
                    ' or None' if ITERATOR_ARGUMENTS[key] else '',
                    _EXAMPLE, SEPARATOR))
    if factor is not None and 'n_prefetch' in arguments:
        raise ValueError(
            'loader {!r}: K and n_prefetch both set the depth (:K means '
            'n_prefetch = K x workers); give one, e.g. chainiter:8 or '
            'chainiter:n_prefetch=16'.format(name))
    return base, factor, arguments


def iterator_arguments(name, workers):
    """The MultiprocessIterator keyword arguments that the chainiter loader
    ``name`` sets for ``workers`` workers: ``:K`` is ``n_prefetch = K x
    workers`` (DataLoader's prefetch_factor=K), and the arguments the name
    carries; none at the defaults (the self-tuning depth)."""
    _, factor, arguments = parse_loader(name)
    if factor:
        arguments['n_prefetch'] = factor * workers
    return arguments


def unsupported(name, workload):
    """Why the loader ``name`` cannot run ``workload`` as the others do, or
    ``None`` when it can."""
    if parse_loader(name)[0] == 'grain' and workload.order is not None:
        return ("each of its batches is one bucket, dealt by its own batch "
                "order; Grain's DataLoader takes records one at a time from "
                "an IndexSampler and has no batch sampler")
    return None


def make_loader(name, workload, workers, start_method=None):
    """``(next_batch, close)`` for a loader on a workload; chainiter's
    workers start by ``start_method`` (None: the iterator's default)."""
    base, factor, _ = parse_loader(name)
    batch_size = workload.batch_size
    if base == 'torch' and workload.torch_batches is not None:
        return _torch_batched(workload, workers, factor)
    if base == 'grain':
        return _grain(workload, workers, factor)
    dataset = workload.make()
    if workload.order is not None and batch_size != dataset.block:
        dataset.block = batch_size     # each batch one bucket
    order = None if workload.order is None else workload.order(
        dataset, batch_size)
    if base in CHAINITER:
        import chainiter
        stacked = not CHAINITER[base]
        if base.startswith('threads'):
            it = chainiter.MultithreadIterator(
                dataset, batch_size, n_threads=workers, seed=0,
                dataset_timeout=None, order_sampler=order,
                converter=workload.converter if stacked else None,
                **iterator_arguments(name, workers))
        else:
            it = chainiter.MultiprocessIterator(
                dataset, batch_size, n_processes=workers, seed=0,
                dataset_timeout=None, order_sampler=order,
                converter=workload.converter if stacked else None,
                start_method=start_method,
                **iterator_arguments(name, workers))
        if stacked:
            return it.__next__, it.finalize
        convert = workload.converter

        def next_batch():
            # The consumer converts, as Chainer's StandardUpdater does.
            return convert(next(it))
        next_batch.iterator = it
        return next_batch, it.finalize
    if base == 'torch':
        import torch.utils.data
        options = {'prefetch_factor': factor} if factor else {}
        if order is None:
            options.update(batch_size=batch_size, shuffle=True)
        else:
            options.update(batch_sampler=order)
        loader = torch.utils.data.DataLoader(
            dataset, num_workers=workers, persistent_workers=workers > 0,
            collate_fn=workload.torch_collate, **options)
        return _endless(loader)
    # serial: a plain loop
    rng = numpy.random.default_rng(0)

    def permutation():
        if order is not None:
            return order.order()
        return rng.permutation(len(dataset))
    state = {'order': permutation(), 'pos': 0}
    convert = workload.converter

    def next_batch():
        if state['pos'] + batch_size > len(state['order']):
            state['order'] = permutation()
            state['pos'] = 0
        indices = state['order'][state['pos']:state['pos'] + batch_size]
        state['pos'] += batch_size
        return convert([dataset[i] for i in indices])
    return next_batch, lambda: None


def _endless(loader):
    """``(next_batch, close)`` over a DataLoader, epoch after epoch."""
    state = {'it': iter(loader)}

    def next_batch():
        try:
            return next(state['it'])
        except StopIteration:
            state['it'] = iter(loader)
            return next(state['it'])
    return next_batch, lambda: state.pop('it', None)


def _torch_batched(workload, workers, factor):
    """DataLoader's fastest path for data that can be fancy-indexed (of
    those measured on 'tiny-batched': ``__getitems__`` with an identity
    collate was slower): one ``dataset[indices]`` per batch, no collate
    (``batch_size=None``: numpy arrays become tensors, not stacked)."""
    import torch.utils.data
    dataset = workload.torch_batches()
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.RandomSampler(dataset), workload.batch_size,
        drop_last=False)
    options = {'prefetch_factor': factor} if factor else {}
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, sampler=sampler, num_workers=workers,
        persistent_workers=workers > 0, **options)
    return _endless(loader)


def _grain(workload, workers, factor):
    """Grain's DataLoader at its defaults (its ReadOptions' reader threads
    in each worker too), over an endless shuffled sampler; ``:K`` sets
    ``worker_buffer_size`` (batches per worker in flight)."""
    import grain
    reason = unsupported('grain', workload)
    if reason:
        raise ValueError('grain cannot run {}: {}'.format(workload.name,
                                                         reason))
    dataset = workload.make()
    sampler = grain.samplers.IndexSampler(
        num_records=len(dataset), shuffle=True, seed=0, num_epochs=None)
    # Grain's own stacking, as concat_examples stacks; a workload that
    # pads brings its converter.
    batch_fn = None if workload.converter is concat_examples \
        else workload.converter
    options = {'worker_buffer_size': factor} if factor else {}
    loader = grain.DataLoader(
        data_source=dataset, sampler=sampler,
        operations=[grain.transforms.Batch(batch_size=workload.batch_size,
                                           batch_fn=batch_fn)],
        worker_count=workers, **options)
    state = {'it': iter(loader)}
    # Grain closes the iterator (stops its workers) when it is collected.
    return (lambda: next(state['it'])), lambda: state.pop('it', None)


#: The name MultithreadIterator's worker threads begin with.
WORKER_THREAD = 'chainiter-worker-'


def thread_cpu_s(thread):
    """The CPU seconds ``thread`` (alive) has run, from its own clock."""
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


class MainCpu:
    """The main process's CPU spent by the loader over the timed window:
    what the main thread spends inside ``next_batch()`` (its own clock,
    ``time.thread_time``, read around each call: the batch's
    conversion by the consumer included, for chainiter-list as for a
    Chainer loop, and ``touch``, the training step's reading, left out),
    and every other thread of the process but the benchmark's own memory
    sampler: chainiter's receiver thread, DataLoader's pin-memory thread
    if any, Grain's reader threads, torch's intra-op threads, whatever a
    loader starts.  Those are the process's CPU clock
    (``CLOCK_PROCESS_CPUTIME_ID``: every thread of the process, those
    that ended too; the workers are other processes) less the main
    thread's clock and the sampler's (``pthread_getcpuclockid``): each
    clock exact to the nanosecond, and no thread's time guessed from
    another's.  Naming each loader's threads instead would miss the
    threads a library starts that Python does not see.  The one exception:
    a threads loader's worker threads (``WORKER_THREAD``) are its
    workers, not the main process's overhead; their CPU is counted apart
    (``worker_threads_cpu_us_per_batch``)."""

    def __init__(self, pss_thread):
        self._pss_thread = pss_thread
        self.in_next = 0.0      # the main thread, inside next_batch()
        # MultithreadIterator's worker threads (the threads loaders) do
        # the workers' work, in this process: counted apart (``workers``).
        self._workers = []

    def start(self):
        self._workers = [t for t in threading.enumerate()
                         if t.name.startswith(WORKER_THREAD)]
        self._marks = self._read()

    def stop(self):
        """``(main thread in next_batch, other threads, worker threads)``,
        in seconds."""
        process, main, pss, workers = (
            b - a for a, b in zip(self._marks, self._read()))
        return self.in_next, process - main - pss - workers, workers

    def _read(self):
        return (time.process_time(), time.thread_time(),
                thread_cpu_s(self._pss_thread),
                sum(thread_cpu_s(t) for t in self._workers))


def measure(loader, workload_name, workers, seconds, warmup_s=1.0,
            batch_size=None):
    workload = workloads.get(workload_name, batch_size)
    pss = PeakPss()
    start = time.perf_counter()
    next_batch, close = make_loader(loader, workload, workers)
    touch(next_batch())
    first = time.perf_counter() - start
    warm_end = time.perf_counter() + warmup_s
    while time.perf_counter() < warm_end:
        touch(next_batch())
    n = 0
    pss.timing()
    cpu = MainCpu(pss.thread)
    clock = time.thread_time
    cpu.start()
    t0 = time.perf_counter()
    while True:
        mark = clock()
        batch = next_batch()
        cpu.in_next += clock() - mark
        touch(batch)
        del batch
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds and n >= 3:
            break
    in_next, others, workers_s = cpu.stop()
    rate = n * workload.batch_size / elapsed
    peak = pss.stop()
    close()
    return {'loader': loader, 'workload': workload_name, 'workers': workers,
            'examples_per_s': rate, 'first_batch_s': first,
            'peak_pss_bytes': peak, 'batches': n,
            'main_cpu_us_per_batch': (in_next + others) * 1e6 / n,
            'main_thread_cpu_us_per_batch': in_next * 1e6 / n,
            'other_threads_cpu_us_per_batch': others * 1e6 / n,
            'worker_threads_cpu_us_per_batch': workers_s * 1e6 / n}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    loader, workload_name, workers, seconds = argv[:4]
    warmup = float(argv[4]) if len(argv) > 4 else 1.0
    batch_size = int(argv[5]) if len(argv) > 5 and argv[5] != '0' else None
    result = measure(loader, workload_name, int(workers), float(seconds),
                     warmup, batch_size)
    print(json.dumps(result), flush=True)


if __name__ == '__main__':
    main()
