"""The start-method fixture, once for the whole suite: every test that
takes ``method`` runs under fork, forkserver and spawn."""

import pytest

from helpers import START_METHODS


@pytest.fixture(params=START_METHODS)
def method(request):
    return request.param
