"""The self-tuning depth: how many batches (or groups) are in flight.  One
budget: the slots of the depth, plus two (the batch the user holds and
the one being handed out), within ``prefetch_bytes``; a floor below which
no budget goes, and the room the limit of open files leaves.  Pure."""

# What a new slot must leave free of ``ulimit -n`` (a slot holds two
# descriptors; replacing a worker takes a few): ``room.py`` checks it.
SPARE_DESCRIPTORS = 32


def floor(n, cpus, batch_size, whole):
    """The fewest batches in flight, whatever ``prefetch_bytes`` holds:
    two per worker, or two for each of the ``n`` workers that can run at
    once (the ``cpus``), as long as the workers share those batches'
    chunks (``Book.open_batch``) and all of them hold one: each slot more
    only costs its memory and the workers' first touch of it (16 workers
    of 38 MB batches on 2 CPUs: 1.2 GB).  Not when a batch may not be
    split (``whole``): for the converter in the workers (one batch a
    worker), or where each chunk counts against ``maxtasksperchild``."""
    if whole:
        return 2 * n
    return max(2 * min(n, cpus), -(-n // batch_size))


def tuned(options, batch_size, slot_bytes, group, room):
    """The depth in jobs (batches, or groups of ``group`` batches) for
    slots of ``slot_bytes`` (a group's slot holds all its batches);
    ``room``: the descriptors left (``room.descriptor_room``; None: no
    limit)."""
    n = options.n_processes
    fits = options.prefetch_bytes * group // max(slot_bytes, 1) - 2
    if group > 1:
        # As many batches in flight as one by one, in groups; each worker
        # still has two (small: fewer would be split in more chunks, each
        # a message).
        depth = max(2 * n, -(-min(options.max_depth, fits) // group))
    else:
        whole = options.in_workers or options.maxtasksperchild is not None
        depth = max(floor(n, options.cpus, batch_size, whole),
                    min(options.max_depth, fits))
    if room is not None:
        # A slot holds two descriptors here (its file's and its mapping's)
        # and one in each worker, and slots leave a spare (slots.py): take
        # half of the rest, for the program's needs.
        depth = max(1, min(depth, (room - SPARE_DESCRIPTORS) // 4 - 2))
    return depth


def at_least(depth, n_prefetch, group):
    """The depth in jobs (batches, or groups of ``group`` batches), at
    least an explicit ``n_prefetch`` batches in flight (a floor: the
    batches loaded ahead of the user or being loaded, a group's all
    counted).  The iterator keeps ``jobs * group`` batches dispatched
    ahead.  In groups, two of those may not be with a worker yet: the
    last group, up to ``group - 1`` batches while it fills (the first
    ones then belong to the group being handed out, loaded), and the
    group before it, a full one posted while the receiver thread rests,
    which submits it when a later ``next()`` wakes it
    (``Groups.work_ahead``) or at its next look (``receiver.POLL_S``):
    so ``jobs * group - (2 * group - 1)`` batches at least are loaded or
    loading."""
    if n_prefetch is None:
        return depth
    if group == 1:
        return max(depth, n_prefetch)
    return max(depth, -(-(n_prefetch + 2 * group - 1) // group))


def largest_group(options, batch_slot_bytes):
    """The most batches a group may hold: the slots of a grouped depth
    (two per worker, ``tuned``'s floor) and two, each of that many
    batches of ``batch_slot_bytes``, within ``prefetch_bytes`` (an
    explicit ``n_prefetch`` is a floor of batches in flight: it never
    limits the groups); with ``maxtasksperchild``, a group is at most
    that many tasks (it counts as its batches)."""
    largest = options.prefetch_bytes // (
        (2 * options.n_processes + 2) * max(batch_slot_bytes, 1))
    if options.maxtasksperchild is not None:
        largest = min(largest, options.maxtasksperchild)
    return largest
