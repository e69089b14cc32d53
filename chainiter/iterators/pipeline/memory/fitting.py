"""Buffer fitting: sizing the shared-memory buffers from a batch that did
not (fully) go through them (the first batch, or one with an oversize
example), and the warnings that tell the user, each given once."""

import warnings

from chainiter.errors import SharedMemoryWarning
from chainiter.iterators.pipeline.memory import stacked_layout
from chainiter.iterators.pipeline.memory.room import DESCRIPTOR_ERRNOS


class Fitting:
    """The warnings given so far (copied and pickled with the iterator)."""

    def __init__(self):
        self.warned_size = False
        self.warned_mismatch = False
        self.warned_descriptors = False

    def fit(self, pool, examples, layout, oversize, in_workers):
        """Size ``pool``'s buffers for ``examples``, of which ``oversize``
        did not fit ``layout`` (None: no buffers yet).  Returns the new
        slot bytes when the buffers were enlarged (the depth follows
        them), else None.  Called by ``reading.read`` and
        ``reading.read_converted`` from the iterator's ``_collect`` (or
        ``group_flow.arrive``): the warnings' ``stacklevel`` counts those
        frames."""
        slots = pool.slots
        if slots.cannot_grow:
            return None
        new, mismatch = slots.fit(examples, layout, oversize)
        if mismatch is not None:
            self._warn_mismatch(mismatch)
        if new is None:
            return None
        sizes = _sizes(slots, layout, new, oversize) \
            if layout is not None and oversize and not self.warned_size \
            else None
        if sizes is not None:
            self.warned_size = True
            warnings.warn(
                ('a converted batch' if in_workers else 'an example') +
                ' with {} bytes of arrays did not fit its shared '
                'memory ({} bytes{} per example); it was delivered intact '
                'through a copy and the buffers were enlarged. Pass '
                'shared_mem={} (or more) to reserve enough from the '
                'start'.format(*sizes), SharedMemoryWarning, stacklevel=4)
        if layout is None:
            try:
                pool.use_layout(new)   # no room at all: a clear error
            except OSError as e:
                if e.errno not in DESCRIPTOR_ERRNOS:
                    raise
                # Tried again with the next batch that comes by copy.
                self._warn_no_descriptors(e)
            return None
        try:
            pool.use_layout(new)
        except MemoryError as e:
            # The old buffers stay; larger examples keep coming by copy.
            slots.cannot_grow = True
            warnings.warn('the shared-memory buffers could not be enlarged, '
                          'so larger examples keep coming by copy: {}'.format(
                              e), SharedMemoryWarning, stacklevel=4)
            return None
        return new.slot_bytes

    def _warn_no_descriptors(self, error):
        if self.warned_descriptors:
            return
        self.warned_descriptors = True
        warnings.warn(
            'no file descriptor is left for the shared-memory buffers ({}), '
            'so the batches come by copy, which is slower, until one is '
            'free (each slot takes two). Raise the limit (ulimit -n, or '
            'resource.setrlimit(resource.RLIMIT_NOFILE, ...)) or close '
            'files'.format(error), SharedMemoryWarning,
            stacklevel=5)

    def _warn_mismatch(self, how):
        if self.warned_mismatch:
            return
        self.warned_mismatch = True
        warnings.warn(
            'a batch did not match the layout measured from the first batch '
            '({}) in a way the shared-memory buffers cannot adapt to, so the '
            'main process stacked it from copies, which is slower; every '
            'such batch is. Give every example the same structure (and '
            'padded fields the same dtype and number of dimensions) to have '
            'the workers stack it in shared memory'.format(how),
            SharedMemoryWarning, stacklevel=5)


def _sizes(slots, layout, new, oversize):
    """What the warning for ``oversize`` names: the bytes of the largest
    example's arrays, the room for them an example had (in ``layout``),
    and the ``shared_mem`` that gives the room ``new`` has; None when
    its arrays had the room (it came by copy for its shapes: list batches
    whose arrays turned ragged have padded rows from then on; or for a
    value that is not an array, a label that outgrew its rows, which
    ``shared_mem`` does not count).  Stacked rows count as ``shared_mem``
    does (``array_bytes``); the list layout's regions as they are."""
    per_example = slots.batch_size
    if layout.mode == 'stacked' and new.mode == 'stacked':
        sizes = [(stacked_layout.array_bytes(layout, e),
                  stacked_layout.array_bytes(new, e)) for e in oversize]
        if all(a is not None and b is not None for a, b in sizes):
            (need, room), (_, more) = max(sizes, key=lambda s: s[0][0])
            return (need, room, ' of arrays', more) if need > room \
                else None
    return (max(slots.measure(e) for e in oversize),
            layout.slot_bytes // per_example, '',
            new.slot_bytes // per_example)


def outgrown(slots, layout, whole):
    """Whether an example of ``whole`` (those that came whole) has more
    bytes of arrays than their room in ``layout`` (they came for their
    size, not for their structure or kinds)."""
    for example in whole:
        if layout.mode == 'stacked':
            sizes = stacked_layout.array_bytes(layout, example)
            if sizes is not None and sizes[0] > sizes[1]:
                return True
        elif slots.measure(example) > layout.example_bytes:
            return True
    return False
