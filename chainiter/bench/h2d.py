"""Host-to-GPU copy bandwidth: ``python -m chainiter.bench.h2d``.

Three ways to get a stacked 64 x 3 x 224 x 224 float32 batch (38.5 MB) onto
GPU 0, each timed from the host array to the copy's completion:
    pageable   ``cupy.asarray`` of an ordinary numpy array
    staging    what DevicePrefetcher does for a host batch: a copy into
               page-locked memory, then an asynchronous copy
    shm-pinned what DevicePrefetcher does for MultiprocessIterator's batch:
               an asynchronous copy straight from its shared memory,
               page-locked once
"""

import time

import numpy

import chainiter
from chainiter.backends import cuda
from chainiter.dataset._pinning import shared_region
from chainiter.dataset.async_transfer import AsyncTransfer


class _Images:
    def __init__(self, n=512):
        self.image = numpy.ones((3, 224, 224), dtype=numpy.float32)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.image


def _rate(nbytes, fn, repeats=30):
    import cupy
    fn()
    cupy.cuda.Device(0).synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    cupy.cuda.Device(0).synchronize()
    return nbytes * repeats / (time.perf_counter() - start) / 1e9


def main():
    cupy = cuda.check_available(0)
    with chainiter.MultiprocessIterator(
            _Images(), 64, n_processes=2, seed=0,
            converter=chainiter.concat_examples) as it:
        for _ in range(8):
            batch = next(it)
            if shared_region(batch) is not None:
                break
        else:
            raise RuntimeError('no batch came through shared memory')
        pageable = numpy.array(batch)
        transfer = AsyncTransfer(0)

        def through(host):
            def copy():
                transfer.issue(host)
                transfer.stream.synchronize()
            return copy

        rows = [('pageable', _rate(pageable.nbytes,
                                   lambda: cupy.asarray(pageable))),
                ('staging', _rate(pageable.nbytes, through(pageable))),
                ('shm-pinned', _rate(pageable.nbytes, through(batch)))]
        paths = dict(transfer.copies)
        del batch
    print('{} (MB/batch {:.1f})'.format(
        cupy.cuda.runtime.getDeviceProperties(0)['name'].decode(),
        pageable.nbytes / 1e6))
    for name, rate in rows:
        print('{:12s} {:6.1f} GB/s'.format(name, rate))
    print('arrays copied, by path:', paths)
    assert paths['direct'] == 31 and paths['staged'] == 31, paths


if __name__ == '__main__':
    main()
