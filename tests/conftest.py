"""Fixtures for the whole suite: every test that takes ``method`` runs under
fork, forkserver and spawn; every test that takes ``make`` runs with each
in-process iterator kind (serial, one thread, three threads)."""

import functools
import multiprocessing

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
