"""Fixtures for the whole suite: every test that takes ``method`` runs under
fork, forkserver and spawn; every test that takes ``make`` runs with each
in-process iterator kind (serial, one thread, three threads).

On a free-threaded build (3.13t) the run fails if the GIL is on at its
end: an extension module without free-threading support turns it back on
when it is imported (with a RuntimeWarning, which the suite's
``filterwarnings = error`` makes the importing test's error).  The first
test after which it was on is named.
"""

import functools
import multiprocessing
import sys
import sysconfig

import pytest

from chainiter import MultithreadIterator, SerialIterator

from helpers import START_METHODS

# The forkserver starts with chainiter (and numpy) imported, so that its
# workers fork with them.  Python's own preload of the main module does
# not happen (the server looks for a 'main_path' that the preparation data
# names 'init_main_from_path'), so without this every forkserver worker of
# the suite imports them anew, about 0.3 s each: minutes in all.  Under
# spawn every worker still starts from nothing.
multiprocessing.set_forkserver_preload(['chainiter'])

IN_PROCESS_KINDS = {
    'serial': SerialIterator,
    'thread1': functools.partial(MultithreadIterator, n_threads=1),
    'thread3': functools.partial(MultithreadIterator, n_threads=3),
}


@pytest.fixture(params=START_METHODS)
def method(request):
    return request.param


@pytest.fixture(params=sorted(IN_PROCESS_KINDS))
def make(request):
    return IN_PROCESS_KINDS[request.param]


# ---- free-threaded builds: the GIL stays off --------------------------------

FREE_THREADED = bool(sysconfig.get_config_var('Py_GIL_DISABLED'))
_gil_first_on = []       # where the GIL was first seen on


def _gil_enabled():
    return FREE_THREADED and sys._is_gil_enabled()


def _gil_seen(where):
    if _gil_enabled() and not _gil_first_on:
        _gil_first_on.append(where)


def pytest_configure(config):
    _gil_seen('at the start (PYTHON_GIL=1, or an import by a plugin)')


def pytest_collection_finish(session):
    _gil_seen('after the collection (an import by a test module)')


def pytest_runtest_logfinish(nodeid, location):
    _gil_seen('after ' + nodeid)


def pytest_sessionfinish(session, exitstatus):
    if _gil_enabled():
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _gil_enabled():
        terminalreporter.write_sep('=', 'the GIL is on', red=True)
        terminalreporter.line(
            'This free-threaded interpreter ends the run with the GIL on '
            '(sys._is_gil_enabled()), first seen {}: an extension module '
            'without free-threading support was imported (its import warns '
            'with a RuntimeWarning).  The run fails.'.format(
                _gil_first_on[0] if _gil_first_on else 'at the end'))
