"""Sphinx configuration of chainiter's documentation.

Build (warnings are errors) and run the guides' examples::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
    python -m sphinx -W --keep-going -b doctest docs docs/_build/doctest
"""

import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
# The checkout's chainiter (installed with pip install -e too), and
# docs/_examples, whose module-level classes the examples' workers import.
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, '_examples'))

import chainiter  # noqa: E402

project = 'chainiter'
author = 'chainiter contributors'
copyright = 'chainiter contributors'
release = version = chainiter.__version__

extensions = [
    'sphinx.ext.autodoc',
    'sphinx.ext.napoleon',
    'sphinx.ext.doctest',
]

html_theme = 'furo'
html_title = 'chainiter {}'.format(release)
exclude_patterns = ['_build']
nitpicky = False

autodoc_member_order = 'bysource'
autodoc_default_options = {'members': True}
autoclass_content = 'class'
autodoc_typehints = 'signature'
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# Each document's examples run in a scratch directory of their own, where
# they may write snapshots.
doctest_global_setup = '''
import os as _os
import shutil as _shutil
import tempfile as _tempfile
_cwd = _os.getcwd()
_scratch = _tempfile.mkdtemp(prefix='chainiter-doctest-')
_os.chdir(_scratch)
'''
doctest_global_cleanup = '''
_os.chdir(_cwd)
_shutil.rmtree(_scratch)
'''

# The modules whose public names the API reference must cover.
PUBLIC_MODULES = ['chainiter', 'chainiter.iterators', 'chainiter.datasets',
                  'chainiter.serializers', 'chainiter.distributed']


def public_names(module_name):
    module = sys.modules[module_name]
    names = getattr(module, '__all__', None) or [
        n for n in dir(module) if not n.startswith('_')]
    return [n for n in names
            if not isinstance(getattr(module, n), types.ModuleType)]


def check_api_coverage(app, env):
    """Warn (an error under -W) for a public name the reference lacks.

    A name counts as documented when the object it names is documented
    under any name (``chainiter.SerialIterator`` is
    ``chainiter.iterators.SerialIterator``).
    """
    if app.builder.name != 'html':
        return
    from sphinx.util import logging
    logger = logging.getLogger(__name__)
    documented = set()
    for full_name in env.get_domain('py').objects:
        module_name, _, attr = full_name.rpartition('.')
        if module_name in sys.modules and hasattr(
                sys.modules[module_name], attr):
            documented.add(id(getattr(sys.modules[module_name], attr)))
            documented.add(full_name)
    for module_name in PUBLIC_MODULES:
        __import__(module_name)
        module = sys.modules[module_name]
        for name in public_names(module_name):
            full_name = '{}.{}'.format(module_name, name)
            obj = getattr(module, name)
            if full_name in documented:
                continue
            if not isinstance(obj, (tuple, int, str, float)) and \
                    id(obj) in documented:
                continue
            logger.warning('the API reference lacks %s: add it to '
                           'docs/api.rst', full_name)


def setup(app):
    app.connect('env-check-consistency', check_api_coverage)
