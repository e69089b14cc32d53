"""The multiprocess iterator's pure policies, without any process: the
load meter, the grouping policy, the self-tuning depth, the options."""

import functools

import pytest

from chainiter import concat_examples
from chainiter.iterators.pipeline.flow import depth
from chainiter.iterators.pipeline import options
from chainiter.iterators.pipeline.flow.grouping import Grouping
from chainiter.iterators.pipeline.flow.load_meter import (
    ZERO, LoadMeter, Sample)


def test_the_meter_replaces_its_sample_whole():
    meter = LoadMeter()
    first = meter.sample
    meter.add(0.5, 10, 0.25)
    meter.add(0.25, 5)
    assert first == ZERO            # a reader's sample never changes
    assert meter.sample == Sample(0.75, 15, 0.25)


def test_per_example_since_an_earlier_sample():
    assert Sample(1.0, 10, 0.0).per_example_since(ZERO) == 0.1
    assert Sample(3.0, 30, 0.0).per_example_since(
        Sample(1.0, 10, 0.0)) == 0.1
    assert Sample(1.0, 10, 0.0).per_example_since(
        Sample(1.0, 10, 0.0)) is None     # nothing loaded since


def _grouping(**kwargs):
    kwargs = dict(dict(may_group=True, group_s=2e-3, max_group=32,
                       group_after=4, regroup_after=100), **kwargs)
    return Grouping(**kwargs)


def test_the_group_is_chosen_after_group_after_batches_once():
    grouping = _grouping()
    sample = ZERO
    answers = []
    for i in range(6):
        answers.append(grouping.batch_stacked(8, sample))
        sample = Sample(sample.load_s + 8e-5, sample.loaded + 8, 0.0)
    # Measured from the first batch on, chosen at the fourth after it.
    assert answers[:4] == [None] * 4
    assert answers[4] == pytest.approx(8e-5)
    assert not grouping.groupable


def test_batches_of_another_size_or_no_result_choose_nothing():
    grouping = _grouping(group_after=1)
    assert grouping.batch_stacked(8, ZERO) is None
    assert grouping.batch_stacked(5, Sample(1.0, 8, 0.0)) is None
    assert grouping.batch_stacked(8, ZERO) is None    # nothing loaded
    assert grouping.groupable


def test_the_size_within_its_bounds():
    grouping = _grouping()
    assert grouping.size(1e-4, 100, 1) == 20        # 2 ms of batches
    assert grouping.size(1e-6, 100, 1) == 32        # at most max_group
    assert grouping.size(1e-6, 6, 1) == 6           # what fits
    assert grouping.size(1.5e-3, 100, 1) is None    # fewer than 2
    assert grouping.size(1e-4, 100, 16) is None     # not 1.5x as many


def test_groups_are_measured_again_once():
    grouping = _grouping(regroup_after=10)
    grouping.grouped(first=True)
    assert grouping.group_arrived(4, ZERO, 5) is None
    assert grouping.group_arrived(8, Sample(1.0, 100, 0.0), 5) is None
    # Measured from that sample over 10 more batches.
    assert grouping.group_arrived(8, Sample(1.5, 150, 0.0), 5) is None
    assert grouping.group_arrived(4, Sample(2.0, 200, 0.0), 5) == \
        pytest.approx(0.05)
    assert grouping.group_arrived(100, Sample(9.0, 900, 0.0), 5) is None
    grouping = _grouping(regroup_after=1)
    grouping.grouped(first=True)
    grouping.stopped()
    assert grouping.group_arrived(100, Sample(9.0, 900, 0.0), 5) is None


def _options(**kwargs):
    kwargs = dict(dict(
        n_processes=4, n_prefetch=None, prefetch_bytes=256 * 2 ** 20,
        shared_mem=None, dataset_timeout=30.0, maxtasksperchild=None,
        converter=concat_examples, converter_in_workers=False,
        start_method='fork', worker_init_fn=None,
        max_prefetch_per_worker=16), **kwargs)
    return options.read(kwargs.pop('cpus', 2), **kwargs)


def test_options_read_what_follows_from_the_arguments():
    o = _options()
    assert (o.stacked, o.padding, o.in_workers, o.may_group) == \
        (True, None, False, True)
    assert (o.first_depth, o.max_depth) == (1, 64)
    o = _options(converter=functools.partial(concat_examples, padding=0))
    assert (o.stacked, o.padding) == (True, 0)
    o = _options(converter=list, converter_in_workers=True, n_prefetch=2)
    # n_prefetch is a floor: the depth may still tune itself to 16 per
    # worker; a converter in the workers starts with one batch for each.
    assert (o.in_workers, o.may_group, o.first_depth, o.max_depth) == \
        (True, False, 4, 64)
    # A floor above 16 per worker: the slots for it, and it from the first
    # batch on.
    o = _options(n_prefetch=100)
    assert (o.first_depth, o.max_depth) == (100, 100)
    with pytest.raises(ValueError, match='n_processes'):
        _options(n_processes=0)
    with pytest.raises(AttributeError):
        o.n_processes = 3       # frozen


def test_the_depth_budget():
    o = _options()
    # Small slots: as deep as max_depth; large: the floor, 2 per CPU.
    assert depth.tuned(o, 32, 1000, 1, None) == 64
    assert depth.tuned(o, 32, 2 ** 30, 1, None) == 4
    # In groups of 8: as many batches, in groups; two per worker.
    assert depth.tuned(o, 32, 8000, 8, None) == 8
    # Few descriptors left: half of what is left, four to a slot.
    assert depth.tuned(o, 32, 1000, 1, 100) < 64
    assert depth.largest_group(o, 2 ** 20) == 256 // 10


def test_an_explicit_n_prefetch_is_a_floor_that_never_limits_the_groups():
    # The groups are as large with n_prefetch as without it (it once
    # capped them at n_prefetch // (2 * n_processes): none with
    # n_prefetch=4 and 2 workers).
    for n_prefetch in (1, 4, 8, 1000):
        assert depth.largest_group(
            _options(n_processes=2, n_prefetch=n_prefetch), 1000) == \
            depth.largest_group(_options(n_processes=2), 1000) > 32
    # The depth in jobs: the tuned one, unless the floor asks for more.
    assert depth.at_least(12, None, 4) == 12
    assert depth.at_least(12, 3, 1) == 12
    assert depth.at_least(2, 3, 1) == 3
    # In groups, the last group may still be filling (up to group - 1
    # batches no worker has) and the one before it posted, not submitted
    # yet: enough jobs that n_prefetch batches are loaded or loading all
    # the same.
    for n_prefetch in range(1, 70):
        for group in range(2, 9):
            jobs = depth.at_least(1, n_prefetch, group)
            assert jobs * group - (2 * group - 1) >= n_prefetch
            assert jobs == 1 or \
                (jobs - 1) * group - (2 * group - 1) < n_prefetch
    assert depth.at_least(4, 64, 4) == 18
    # maxtasksperchild caps a group: it counts as its batches.
    assert depth.largest_group(
        _options(n_processes=2, n_prefetch=64, maxtasksperchild=3),
        1000) == 3
