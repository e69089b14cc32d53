"""Classes and functions that spawned workers cannot import: sent by value.

Pickle sends a class or a function by reference (module and name), and
the worker imports it.  That fails for

- what a notebook cell, the REPL or ``python -c`` defines: it lives in
  ``__main__``, which a spawned or forkserver worker does not have (a
  script's ``__main__`` it does: multiprocessing runs the script's file
  again in each worker, as ``__mp_main__``, so that stays by reference);
- lambdas, closures and classes defined inside a function
  (``<lambda>``, ``<locals>`` in the name).

``wanted(obj)`` tells these apart; the pickler of ``array_pickle.py``
hands them to cloudpickle, which pickles them by value (their code, and
the globals they use).  This is the only module that imports
cloudpickle, and only when such an object is met: numpy stays the only
dependency, and a dataset that needs cloudpickle where it is missing is
``Missing`` (the iterator says ``pip install cloudpickle`` before any
worker starts).

A class or function of ``__main__`` sent by value is also set as an
attribute of the worker's ``__main__`` (when that name is free), so that
the worker can pickle what it sends home by reference: an example or an
exception of a notebook's class reaches the main process as that class.
"""

import os
import sys
import types

_MISSING = object()

_module = None          # cloudpickle, once imported
_import_error = None    # why it could not be


class Missing(ImportError):
    """An object needs cloudpickle, which is not installed."""

    def __init__(self, obj, error):
        super().__init__('{} needs cloudpickle to reach the workers: '
                         'pip install cloudpickle'.format(describe(obj)))
        self.obj = obj
        self.error = error


def cloudpickle(obj):
    """The cloudpickle module, imported at the first call; ``Missing``
    (naming ``obj``, the object that needs it) when it cannot be."""
    global _module, _import_error
    if _module is None and _import_error is None:
        try:
            import cloudpickle as module
        except ImportError as e:
            _import_error = e
        else:
            _module = module
    if _module is None:
        raise Missing(obj, _import_error) from _import_error
    return _module


def main_reaches_workers():
    """Whether spawned workers run ``__main__`` again (a script, a module
    run with ``-m``), so its top-level names can be imported there.  The
    rules of ``multiprocessing.spawn.get_preparation_data`` and
    ``prepare``."""
    main = sys.modules.get('__main__')
    name = getattr(getattr(main, '__spec__', None), 'name', None)
    if name is not None:
        return name != '__main__' and not name.endswith('.__main__')
    path = getattr(main, '__file__', None)
    if not isinstance(path, str):
        return False
    if os.path.splitext(os.path.basename(path))[0] == 'ipython':
        return False
    return os.path.isfile(path)


def wanted(obj):
    """Whether ``obj`` is a class or function that a worker could not
    import by its module and name."""
    if not isinstance(obj, (type, types.FunctionType)):
        return False
    module_name = getattr(obj, '__module__', None)
    qualname = getattr(obj, '__qualname__', None)
    if not isinstance(module_name, str) or not isinstance(qualname, str):
        return False           # pickle's own rules (and errors) apply
    if module_name == '__main__' and not main_reaches_workers():
        return True
    module = sys.modules.get(module_name)
    if module is None:
        return False           # pickle imports it, or says why not
    target = module
    try:
        for part in qualname.split('.'):
            target = getattr(target, part, _MISSING)
            if target is _MISSING:
                return True    # '<lambda>', '<locals>', a deleted name
    except Exception:  # noqa: BLE001 (a module's __getattr__ gone wrong)
        return False           # pickle's own rules (and errors) apply
    return target is not obj


def describe(obj):
    """``obj`` as an error message names it."""
    kind = 'class' if isinstance(obj, type) else 'function'
    where = getattr(obj, '__module__', '?')
    name = '{}.{}'.format(where, getattr(obj, '__qualname__', '?'))
    if '<lambda>' in name:
        return 'the lambda {}'.format(name)
    if '<locals>' in name:
        return 'the {} {} (defined inside a function)'.format(kind, name)
    if where == '__main__':
        return 'the {} {} (defined in a notebook, the interactive ' \
            'interpreter or python -c, which the workers cannot ' \
            'import)'.format(kind, name)
    return 'the {} {} (which the workers cannot import by that ' \
        'name)'.format(kind, name)


def reduce(reduced, obj):
    """cloudpickle's reduction of ``obj``, made to set ``obj`` in the
    worker's ``__main__`` when it comes from ``__main__``."""
    if not isinstance(reduced, tuple) or len(reduced) != 6 or \
            reduced[5] is None or obj.__module__ != '__main__' or \
            not obj.__qualname__.isidentifier():
        return reduced
    make, args, state, items, dict_items, set_state = reduced
    return make, args, (set_state, state), items, dict_items, _set_in_main


def _set_in_main(obj, setter_and_state):
    """In the worker: set ``obj``'s state, then make it ``__main__``'s."""
    set_state, state = setter_and_state
    set_state(obj, state)
    main = sys.modules.get('__main__')
    if main is not None and not hasattr(main, obj.__qualname__):
        setattr(main, obj.__qualname__, obj)
