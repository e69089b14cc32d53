"""The multiprocess iterator's transport state, in one object: made new
when the iterator is built, unpickled or copied, and in a forked child;
never copied or pickled (``DatasetIterator._transport_attributes``)."""

import weakref

from chainiter.iterators.pipeline.memory import converted, list_layout
from chainiter.iterators.pipeline.groups import Groups
from chainiter.iterators.pipeline.pool.pool import Pool
from chainiter.iterators.pipeline.memory.slots import SlotPool
from chainiter.iterators.pipeline.flow.worker_stats import window_mark


class Transport:
    """Everything the iterator keeps about its pool and what is in flight;
    every other attribute of the iterator is its state or its options."""

    __slots__ = ('pool', 'finalizer', 'by_copy', 'depth', 'tuned',
                 'groups', 'grouping', 'busy_mark')

    def __init__(self, options, grouping):
        # The workers start with the first batch (at once when built, at
        # the first next() when unpickled: unpickling may happen while a
        # spawned process starts, where no process may be started).
        self.pool = None
        self.finalizer = None       # closes the pool
        self.by_copy = 0            # for stats: batches that came by copy
        self.depth = options.first_depth  # measured again
        self.tuned = False          # from the first batch's slot
        self.groups = Groups()      # batches loaded as one
        self.grouping = grouping    # when to group, how many
        self.busy_mark = window_mark(None)  # (pool, load meter Sample)

    def start_pool(self, iterator, options, seed, boundary):
        """Start the pool of ``iterator`` (its dataset and batch size;
        ``seed``: the workers'; ``boundary``: the workers' kind), closed
        once the iterator is gone."""
        # With the converter in the workers a slot holds one converted
        # batch: a list layout of one region.
        batch_size = iterator.batch_size
        threads = boundary.method == 'threads'
        slots = SlotPool(options.max_depth + 2,
                         1 if options.in_workers else batch_size,
                         options.stacked, options.padding,
                         options.shared_mem, exact=options.listed,
                         private=threads)
        if options.shared_mem is not None and not options.stacked:
            # Before any worker starts: they get it as they start.
            slots.replace(list_layout.list_layout(
                slots.batch_size, options.shared_mem * batch_size //
                slots.batch_size))
        dataset = iterator.dataset
        if options.in_workers:
            dataset = converted.WithConverter(dataset, options.converter)
            slots.measure = converted.result_bytes
        self.pool = Pool(boundary,
                         dataset, options.n_processes, seed,
                         options.worker_init_fn, options.maxtasksperchild,
                         self.depth, slots, split=not options.in_workers,
                         cpus=options.cpus)
        self.finalizer = weakref.finalize(iterator, self.pool.close)
