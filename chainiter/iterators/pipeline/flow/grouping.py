"""The grouping policy: whether small batches go to the workers in groups
(several batches loaded as one task), how many, and when to choose again.
How groups are filled and handed out is ``groups.py``'s.  Pure: told the
load meter's samples (``load_meter.Sample``), it answers with the seconds
a batch takes a worker, to choose a size from."""


class Grouping:
    """Batches the workers stack are measured over ``group_after`` of
    them (the workers past their first, slower examples); the group is
    then chosen (``size``), once.  The first measure takes the workers'
    start: each first touches the dataset's pages, and the more workers,
    the fewer batches each has loaded (16 workers measured twice the time
    a batch of tiny examples took 2, and chose half their groups).  So
    once ``regroup_after`` more batches have gone in groups, the next as
    many are measured, and the groups grow if half as large again fit in
    ``group_s``."""

    __slots__ = ('group_s', 'max_group', 'group_after', 'regroup_after',
                 'groupable', '_mark', '_regroup')

    def __init__(self, may_group, group_s, max_group, group_after,
                 regroup_after):
        self.group_s = group_s
        self.max_group = max_group
        self.group_after = group_after
        self.regroup_after = regroup_after
        self.groupable = may_group     # the first measure is still to come
        self._mark = None       # (batches measured, Sample, their size)
        self._regroup = None    # (batches since, Sample or None)

    def batch_stacked(self, size, sample):
        """A batch of ``size`` examples that the workers stacked went
        alone (call only while ``groupable``); the seconds a batch takes
        when the group is to be chosen now, else None."""
        if self._mark is None:
            self._mark = (0, sample, size)
            return None
        count, start, first = self._mark
        count += 1
        self._mark = (count, start, first)
        if count < self.group_after or size != first:
            return None
        per_example = sample.per_example_since(start)
        if per_example is None:         # no result measured since
            return None
        self.groupable = False          # chosen once (grown once)
        return per_example * size

    def size(self, per_batch, fits, current):
        """How many batches go to the workers as one: as many as load in
        about ``group_s`` (``per_batch``: the seconds a batch takes a
        worker), at most ``max_group`` and ``fits`` (``depth.py``); None
        when that is not at least 2 and half as many again as
        ``current``.  Each batch otherwise costs the main process and a
        worker a message, a wake-up and its bookkeeping, which small
        batches cannot pay back."""
        group = int(self.group_s / max(per_batch, 1e-9))
        group = min(group, fits, self.max_group)
        if group < max(2, 1.5 * current):
            return None
        return group

    def grouped(self, first):
        """Batches go in groups now (``first``: they went alone before):
        the first time, they are measured again later."""
        if first:
            self._regroup = (0, None)

    def stopped(self):
        """Each batch goes alone again, for good."""
        self._regroup = None

    def group_arrived(self, size, sample, batch_size):
        """A group of ``size`` batches of ``batch_size`` examples arrived
        stacked; the seconds a batch takes when the group is to be chosen
        again now, else None."""
        if self._regroup is None:
            return None
        count, start = self._regroup
        count += size
        if start is None:
            if count >= self.regroup_after:
                count, start = 0, sample
        elif count >= self.regroup_after:
            per_example = sample.per_example_since(start)
            if per_example is not None:
                self._regroup = None
                return per_example * batch_size
        self._regroup = (count, start)
        return None
