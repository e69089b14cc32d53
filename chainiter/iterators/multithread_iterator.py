import concurrent.futures
import weakref
from typing import Any, Callable, Optional, Tuple, Union

from chainiter import _context
from chainiter.errors import IteratorFinalizedError
from chainiter.iterators import _args, _state
from chainiter.iterators._base import DatasetIterator


class _Chunks(list):
    """The futures of a batch loaded by a batch method, one per chunk."""


def _shutdown(pool):
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
            if not future.done():
                # Also wake up when finalize() is called from another thread.
                concurrent.futures.wait(
                    (future, self._closed),
                    return_when=concurrent.futures.FIRST_COMPLETED)
                if self._closed.done():
                    raise IteratorFinalizedError(
                        'MultithreadIterator was finalized while next() '
                        'waited for a batch')
            batch.append(future.result())
        if type(futures) is _Chunks:
            return [example for chunk in batch for example in chunk]
        return batch

    def _ready_batches(self):
        return sum(1 for futures in self._pending.handles()
                   if isinstance(futures, list)
                   and all(future.done() for future in futures))

    def _drop_pending(self):
        for futures in self._pending.handles():
            for future in futures if isinstance(futures, list) else ():
                future.cancel()
        super()._drop_pending()

    def finalize(self) -> None:
        if not self._closed.done():
            self._closed.set_result(None)
        super().finalize()
        self._finalizer()
