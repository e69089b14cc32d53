"""A fuzz over random example structures (``fuzz_examples.FuzzDataset``):
tuples, dicts and bare values; arrays of every numpy kind and byte order,
of one shape or ragged, 0-d arrays, numpy scalars and Python values;
fields that change kind, shape or dtype mid-epoch, dicts whose key order
varies.  For each, the batches of a ``MultiprocessIterator`` (and of a
``MultithreadIterator``: the same pipeline, with threads, and with
threads that switch to loading in the main thread and back) equal those
of a ``SerialIterator`` with the same converter, element by element: list
batches (no converter), stacked (``concat_examples``) and padded
(``padding=0``); ``concat_examples`` of a list batch equals that of the
serial one, or raises the same error.  A converter that raises for a
batch raises the same error from the same ``next()``.

The seeds are fixed: every run draws the same datasets."""

import functools
import warnings

import pytest

from chainiter import (
    MultiprocessIterator, MultithreadIterator, SerialIterator,
    concat_examples)

from chainiter.iterators.pipeline.threads.workers import gil_enabled
from fuzz_examples import FuzzDataset, difference
from helpers import fingerprint

CONVERTERS = {
    'list': None,
    'stacked': concat_examples,
    'padded': functools.partial(concat_examples, padding=0),
}
# Under fork the workers start in milliseconds: many datasets; under
# forkserver and spawn, fewer.
SEEDS = {'fork': range(0, 60), 'forkserver': range(60, 70),
         'spawn': range(70, 80), 'threads': range(80, 140),
         # Threads that load in the main thread by turns (a build with
         # the GIL: tests/test_thread_loading.py).
         'threads-switching': range(140, 170)}


@pytest.fixture(autouse=True)
def group_early(monkeypatch):
    """Group after two batches, in groups of at most four."""
    for kind in (MultiprocessIterator, MultithreadIterator):
        monkeypatch.setattr(kind, 'GROUP_AFTER', 2)
        monkeypatch.setattr(kind, 'GROUP_S', 10.0)
        monkeypatch.setattr(kind, 'MAX_GROUP', 4)


def _convert(converter, batch):
    """The converted batch, or the type of error the converter raised."""
    try:
        return batch if converter is None else converter(batch)
    except Exception as error:  # noqa: B902 -- any error, compared
        return type(error)


def _compare(dataset, method, converter, n_processes):
    batch_size = 2 + dataset.seed % 7
    n_batches = 3 * len(dataset) // batch_size + 1
    kwargs = dict(shuffle=True, seed=5)
    if method.startswith('threads'):
        it = MultithreadIterator(dataset, batch_size, n_threads=n_processes,
                                 converter=converter, **kwargs)
    else:
        it = MultiprocessIterator(dataset, batch_size, n_processes=n_processes,
                                  start_method=method, converter=converter,
                                  **kwargs)
    with SerialIterator(dataset, batch_size, **kwargs) as serial, it:
        for k in range(n_batches):
            before = serial.epoch, serial.current_position
            expected = _convert(converter, next(serial))
            if isinstance(expected, type):
                with pytest.raises(expected):
                    next(it)
                # The position stays at the batch that failed.
                assert (it.epoch, it.current_position) == before
                return
            got = next(it)
            if converter is None:
                got_list = list(got)
                assert fingerprint(got_list) == fingerprint(expected), \
                    'batch {}: {}'.format(k, difference(expected, got_list))
                stacked = _convert(concat_examples, got)
                want = _convert(concat_examples, expected)
                assert fingerprint(stacked) == fingerprint(want), \
                    'concat_examples of batch {}: {}'.format(
                        k, difference(want, stacked))
            else:
                assert fingerprint(got) == fingerprint(expected), \
                    'batch {}: {}'.format(k, difference(expected, got))


@pytest.mark.parametrize('method,seed', [
    (method, seed) for method, seeds in SEEDS.items() for seed in seeds])
def test_random_examples_come_back_as_the_serial_iterator_gives_them(
        method, seed, monkeypatch):
    if method == 'threads-switching':
        if not gil_enabled():
            pytest.skip('without the GIL the threads always load: these '
                        'would be the threads seeds again')
        monkeypatch.setattr(MultithreadIterator, 'LOADING_FIRST_PROBE_S', 0)
        monkeypatch.setattr(MultithreadIterator, 'LOADING_WINDOW_S', 0)
        monkeypatch.setattr(MultithreadIterator, 'LOADING_WINDOW_BATCHES', 1)
    dataset = FuzzDataset(seed)
    with warnings.catch_warnings():
        # Examples that outgrow their buffers warn; that is not checked
        # here (tests/test_multiprocess.py does).
        warnings.simplefilter('ignore')
        for name, converter in CONVERTERS.items():
            try:
                _compare(dataset, method, converter, 1 + seed % 2)
            except AssertionError as error:
                raise AssertionError('{} batches of {}: {}'.format(
                    name, dataset.describe(), error)) from None
