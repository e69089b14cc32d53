"""Chainer's training framework takes chainiter iterators as its own.

Chainer's ``StandardUpdater`` and ``Evaluator`` accept one iterator or a
dict of them, and tell the two apart with ``isinstance(it,
chainer.dataset.Iterator)``.  So that they take a chainiter iterator, the
moment Chainer's iterator class exists it becomes the base of
``chainiter.iterators.Iterator``:

- Chainer imported before chainiter: done when chainiter is imported;
- chainiter first: a finder on ``sys.meta_path`` waits for the import of
  ``chainer.dataset.iterator`` (it compares one name per import and removes
  itself once that module is loaded).

chainiter never imports Chainer.  Chainer's base class calls ``finalize()``
from ``__del__``; chainiter's iterators clean up through
``weakref.finalize`` and keep that behaviour (a no-op ``__del__`` is put in
front, so a half-built iterator is never finalized from the collector).
"""

import importlib.abc
import sys

_MODULE = 'chainer.dataset.iterator'


def _adopt(module):
    base = getattr(module, 'Iterator', None)
    from chainiter.iterators._protocol import Iterator
    if not isinstance(base, type) or issubclass(Iterator, base):
        return
    Iterator.__bases__ = (base,)
    Iterator.__del__ = _keep_own_cleanup


def _keep_own_cleanup(self):
    pass


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then adopts the module's Iterator."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _adopt(module)

    def __getattr__(self, name):     # get_source, get_code, ...
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        _uninstall()
        for finder in sys.meta_path:
            find = getattr(finder, 'find_spec', None)
            spec = None if find is None else find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(
                        spec.loader, 'exec_module'):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_finder = _Finder()


def _uninstall():
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass


def adopt_if_loaded():
    """Adopt Chainer's Iterator if it was loaded past the finder (another
    import hook ahead of it); called when an iterator is built."""
    module = sys.modules.get(_MODULE)
    if module is not None and _finder in sys.meta_path:
        _uninstall()
        _adopt(module)


def install():
    """Adopt Chainer's Iterator now if it is loaded, else when it is."""
    module = sys.modules.get(_MODULE)
    if module is not None:
        _adopt(module)
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
