"""Fixtures for the whole suite: every test that takes ``method`` runs under
fork, forkserver and spawn; every test that takes ``make`` runs with each
in-process iterator kind (serial, one thread, three threads)."""

import functools

import pytest

from chainiter import MultithreadIterator, SerialIterator

from helpers import START_METHODS

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
