"""The pickler that takes the large arrays out of a dataset's pickle
(``Pickler``, ``dump``), and the unpickler that views them in a worker
(``Unpickler``): see share.py, which holds the blocks they lie in.
``check_picklable`` pickles as a worker would get it, writing nothing."""

import pickle

import numpy

from chainiter.iterators.pipeline.processes import by_value, shared_arrays
from chainiter.iterators.pipeline.processes.array_places import (
    FilePlace, Place, file_place, file_view, place, shareable, view)
from chainiter.iterators.pipeline.processes.shared_arrays import (
    LentPlace, lent_place, lent_view)


def _view(*args):
    raise pickle.UnpicklingError(
        'this pickle refers to arrays in shared memory; only '
        'chainiter.iterators.pipeline.processes.share.Received.load() reads it')


class Pickler(pickle.Pickler):
    """Pickles with the large arrays taken out, each given a place in block
    ``block`` (recorded in ``new``; one reached again keeps its place).  It
    raises ``_ByValue`` at a class or function that the workers cannot
    import (``by_value.wanted``): ``dump`` then takes
    ``_CloudPickler``, which sends those by value."""

    def __init__(self, file, block, lent=None):
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.lent = lent          # ArrayShare.lend, or None: a check only
        self.block = block
        self.new = {}             # id -> (array, Place or FilePlace)
        self.size = 0             # bytes of the new block
        self.used = set()         # keys of the blocks the stream refers to

    def reducer_override(self, obj):
        if shared_arrays.lent and type(obj) is numpy.ndarray:
            lent = lent_place(obj)
            if lent is not None:      # any size: it is shared already
                mapping, fd, size, where = lent
                key = 'lent' if self.lent is None else self.lent(
                    mapping, fd, size)
                self.used.add(key)
                return _view, tuple(where._replace(block=key)) + ('lent',)
        if not shareable(obj):
            if by_value.wanted(obj):
                return self._by_value(obj)
            return NotImplemented
        found = self.new.get(id(obj))
        if found is None:
            where = file_place(obj)
            if where is None:
                where, self.size = place(obj, self.block, self.size)
            found = self.new[id(obj)] = (obj, where)
        where = found[1]
        if isinstance(where, Place):
            self.used.add(where.block)
        return _view, tuple(where)

    def _by_value(self, obj):
        raise _ByValue(obj)


class _ByValue(Exception):
    """Raised by ``Pickler`` at an object only cloudpickle can send."""

    def __init__(self, obj):
        super().__init__(obj)
        self.obj = obj


_cloud_pickler = None


def _cloud_pickler_class(obj):
    """``Pickler`` on top of cloudpickle's pickler (made at the first
    call): ``by_value.Missing`` when cloudpickle is not installed."""
    global _cloud_pickler
    if _cloud_pickler is None:
        cloudpickle = by_value.cloudpickle(obj)

        class _CloudPickler(Pickler, cloudpickle.Pickler):
            """The large arrays taken out as by ``Pickler``, wherever they
            are (a function's globals too); the classes and functions the
            workers cannot import by value, the rest by reference."""

            def _by_value(self, obj):
                return by_value.reduce(
                    cloudpickle.Pickler.reducer_override(self, obj), obj)

        _cloud_pickler = _CloudPickler
    return _cloud_pickler


def dump(obj, file, block, lent=None):
    """``obj`` pickled into ``file``: the pickler, which tells the arrays
    it took out.  By plain pickle (as fast, and no cloudpickle needed)
    unless ``obj`` holds a class or function that only cloudpickle can
    send; ``file`` must be empty."""
    pickler = Pickler(file, block, lent)
    try:
        pickler.dump(obj)
        return pickler
    except _ByValue as e:
        cls = _cloud_pickler_class(e.obj)
    file.seek(0)
    file.truncate()
    pickler = cls(file, block, lent)
    pickler.dump(obj)
    return pickler


class _Discard:
    """A file that forgets what is written (bytes, or the PickleBuffer of
    an array that protocol 5 hands over without copying)."""

    def write(self, data):
        pass

    def seek(self, offset):
        pass

    def truncate(self):
        pass


def check_picklable(obj):
    """Pickle ``obj`` as a worker would get it, writing nothing anywhere:
    raises what pickling raises, and ``by_value.Missing`` when it needs
    cloudpickle, which is not installed."""
    dump(obj, _Discard(), 0)


class Unpickler(pickle.Unpickler):

    def __init__(self, file, buffers):
        super().__init__(file)
        self._buffers = buffers

    def find_class(self, module, name):
        if module == __name__ and name == '_view':
            return self._view
        return super().find_class(module, name)

    def _view(self, *args):
        if args[-1] == 'lent':
            where = LentPlace(*args[:-1])
            return lent_view(self._buffers[where.block], where)
        if len(args) == len(FilePlace._fields):
            return file_view(FilePlace(*args))
        where = Place(*args)
        return view(self._buffers[where.block], where)
