import concurrent.futures
import weakref
from typing import Any, Callable, Optional, Tuple, Union

from chainiter import _context
from chainiter._interrupts import uninterrupted
from chainiter.errors import IteratorFinalizedError
from chainiter.iterators import _args, _state
from chainiter.iterators._base import DatasetIterator


class _Chunks(list):
    """The futures of a batch loaded by a batch method, one per chunk."""


# How long a wait for a batch holds back a Ctrl-C at most (it is raised
# when the wait ends, outside the locks of concurrent.futures).
_WAIT_SLICE_S = 0.05

# Why the calls into concurrent.futures run under uninterrupted(): a
# KeyboardInterrupt (or a timeout handler's exception) raised in the main
# thread inside them can land between a lock's acquire and the ``with``
# that would release it (threading.Condition.__enter__, the futures'
# _AcquireFutures, ThreadPoolExecutor.submit's semaphore and shutdown
# locks).  That lock stays held for good: the loader threads block on it,
# and so do the next next() and finalize(), where no signal reaches them
# any more.  Free-threaded 3.13t hits this within seconds of a signal
# storm (tests/test_interrupts.py); a build with the GIL rarely.


def _shutdown(pool):
    with uninterrupted():
        pool.shutdown(wait=True, cancel_futures=True)


class MultithreadIterator(DatasetIterator):
    """Loads examples in ``n_threads`` threads, one batch ahead of the user.

    While the user works on batch ``k``, the threads load batch ``k + 1``.
    Arguments are those of ``SerialIterator`` (``shard`` too) plus
    ``n_threads`` (threads in the pool).  ``finalize()`` (or leaving
    ``with``) joins the threads.
    """

    _prefetch_depth = 1
    # Chainer's MultithreadIterator keeps its order under '_order', None
    # included.
    _chainer_order = ('_order', True)

    def __init__(self, dataset: Any, batch_size: int, repeat: bool = True,
                 shuffle: Optional[bool] = None, n_threads: int = 1,
                 order_sampler: Optional[Callable[[Any, int], Any]] = None,
                 *, seed: Optional[int] = None,
                 shard: Union[Tuple[int, int], str, Any, None] = None
                 ) -> None:
        n_threads = _args.positive_int('n_threads', n_threads)
        super().__init__(dataset, batch_size, repeat, shuffle, order_sampler,
                         seed, shard)
        self.n_threads = n_threads
        self._start_transport()

    def _start_transport(self):
        self._closed = concurrent.futures.Future()   # done at finalize()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            self.n_threads, thread_name_prefix='chainiter-loader')
        self._finalizer = weakref.finalize(self, _shutdown, self._pool)

    def _transport_attributes(self):
        return super()._transport_attributes() + (
            '_closed', '_pool', '_finalizer')

    def _submit(self, step):
        with uninterrupted():
            return self._submit_now(step)

    def _submit_now(self, step):
        submit = self._pool.submit
        dataset, seed = self.dataset, self._pass_seed
        if _context.batch_method(dataset) is not None:
            # One call of the batch method per thread, each on its part
            # of the batch; the futures give lists of examples.
            n = len(step.indices)
            chunks = max(1, min(n, self.n_threads))
            bounds = [n * k // chunks for k in range(chunks + 1)]
            return _Chunks(
                submit(_context.load_examples, dataset, step.indices[a:b],
                       seed, _state.cut_spans(step.spans, a, b), [])
                for a, b in zip(bounds[:-1], bounds[1:]))
        load = _context.load_example
        keys = ((e, p) for e, a, b in step.spans for p in range(a, b))
        return [submit(load, dataset, i, seed, e, p)
                for i, (e, p) in zip(step.indices.tolist(), keys)]

    def _collect(self, futures):
        batch = []
        for future in futures:
            while True:
                # Slices of a wait, each holding a Ctrl-C back (see
                # _WAIT_SLICE_S); also wakes up when finalize() is called
                # from another thread.
                with uninterrupted():
                    done = future.done() or bool(concurrent.futures.wait(
                        (future, self._closed), timeout=_WAIT_SLICE_S,
                        return_when=concurrent.futures.FIRST_COMPLETED).done)
                    closed = self._closed.done()
                if closed:
                    raise IteratorFinalizedError(
                        'MultithreadIterator was finalized while next() '
                        'waited for a batch')
                if done:
                    break
            with uninterrupted():
                error = future.exception()
                result = None if error is not None else future.result()
            if error is not None:
                raise error
            batch.append(result)
        if type(futures) is _Chunks:
            return [example for chunk in batch for example in chunk]
        return batch

    def _ready_batches(self):
        with uninterrupted():
            return sum(1 for futures in self._pending.handles()
                       if isinstance(futures, list)
                       and all(future.done() for future in futures))

    def _drop_pending(self):
        with uninterrupted():
            for futures in self._pending.handles():
                for future in futures if isinstance(futures, list) else ():
                    future.cancel()
        super()._drop_pending()

    def finalize(self) -> None:
        with uninterrupted():
            if not self._closed.done():
                self._closed.set_result(None)
        super().finalize()
        self._finalizer()
