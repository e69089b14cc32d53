"""Host-to-GPU copy bandwidth: ``python -m chainiter.bench.h2d``.

Three ways to get a stacked 64 x 3 x 224 x 224 float32 batch onto GPU 0:
    pageable   ``cupy.asarray`` of an ordinary numpy array
    staging    copy into page-locked memory, then an asynchronous copy
    shm-pinned straight from MultiprocessIterator's shared memory,
               page-locked once (what DevicePrefetcher does)
"""

import time

import numpy

import chainiter
from chainiter.backends import cuda
from chainiter.dataset.async_transfer import AsyncTransfer, shared_region


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
        next(it)
        batch = next(it)
        assert shared_region(batch) is not None
        pageable = numpy.array(batch)
        transfer = AsyncTransfer(0)
        stream = transfer.stream
        staging = cuda.alloc_pinned(pageable.nbytes).view(
            numpy.float32).reshape(pageable.shape)
        out = cupy.empty(pageable.shape, dtype=numpy.float32)
        cuda.register_host(*shared_region(batch))

        def staged():
            numpy.copyto(staging, pageable)
            out.set(staging, stream=stream)
            stream.synchronize()

        def from_shm():
            out.set(batch, stream=stream)
            stream.synchronize()

        rows = [('pageable', _rate(pageable.nbytes,
                                   lambda: cupy.asarray(pageable))),
                ('staging', _rate(pageable.nbytes, staged)),
                ('shm-pinned', _rate(pageable.nbytes, from_shm))]
    for name, rate in rows:
        print('{:12s} {:6.1f} GB/s'.format(name, rate))


if __name__ == '__main__':
    main()
