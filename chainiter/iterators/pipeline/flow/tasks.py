"""What the pool sends a worker (a ``Task``: a chunk of a batch, or of a
group of batches) and what a worker's result holds, whichever kind of
worker (a process: ``wire.py`` frames them; a thread: they are handed
over as they are).  Pure."""

import typing

from chainiter.iterators._state import Step


class Task(typing.NamedTuple):
    generation: int
    seq: int
    chunk: int
    start: int              # row of the first example within the batch
    step: Step              # its rows of the batch's Step
    slot: int               # index of the slot to write into, or -1
    buffer_id: int
    seed: int               # keys example_rng()
    # Rows of the batch where each of the batches of a group begins, when
    # the worker must write them apart (a padded field's largest shape is
    # each batch's own; batches of several shapes or dtypes are each
    # read as their own); else empty.
    cuts: tuple = ()
    # The tasks it counts as against ``maxtasksperchild``: a group's, as
    # many as its batches.
    weight: int = 1

    @property
    def indices(self):
        """The dataset indices: an int array in the parent, a list in the
        worker."""
        return self.step.indices

    @property
    def spans(self):
        return self.step.spans


def segments(task):
    """``(a, b)`` row ranges of the task's chunk, cut where a batch of
    its group begins (the whole chunk when ``task.cuts`` is empty)."""
    n = len(task.step)
    inner = [c - task.start for c in task.cuts if task.start < c <
             task.start + n]
    return list(zip([0] + inner, inner + [n]))


class Parts(typing.NamedTuple):
    """A chunk's results, one per segment (``segments``)."""
    metas: list


def segment_metas(chunks):
    """The results of each segment of ``chunks`` (what each chunk of a
    batch tells), in order: a padded group's chunk comes as ``Parts``,
    one per batch it holds."""
    out = []
    for chunk in chunks:
        if type(chunk) is Parts:
            out.extend(chunk.metas)
        else:
            out.append(chunk)
    return out


class Result(typing.NamedTuple):
    generation: int
    seq: int
    chunk: int
    metas: object           # Rows, or per example its metadata or a Whole
    error: object = None    # a RemoteError when loading failed


class Unreadable(typing.NamedTuple):
    """A result whose payload cannot be unpickled in the main process."""
    error: Exception
    traceback: str
