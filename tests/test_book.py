"""The dispatch book, driven without any process or thread: chunks,
assignment, results in any order, generations, deaths and failures."""

import pickle

import numpy

from chainiter.errors import ChainiterError, WorkerDiedError
from chainiter.iterators._state import Step
from chainiter.iterators.pipeline.flow.book import Book


def step(start, n, epoch=0):
    return Step(numpy.arange(start, start + n), ((epoch, start, start + n),))


def result(task, payload=('metas', None)):
    return (task.generation, task.seq, task.chunk, payload)


def book_with_workers(n_workers=2, n_jobs_ahead=1, max_tasks=None):
    book = Book(n_workers, n_jobs_ahead, max_tasks)
    for key in range(n_workers):
        book.add_worker(key)
    return book


def open_and_assign(book, first, n):
    batch, tasks = book.open_batch(step(first, n), 0, None, None, -1, -1)
    return batch, [(book.assign(task), task) for task in tasks]


def test_a_batch_is_cut_into_enough_chunks_to_keep_every_worker_busy():
    book = book_with_workers(n_workers=4, n_jobs_ahead=2)
    batch, tasks = book.open_batch(step(10, 6), 7, None, None, -1, -1)
    assert batch.n_chunks == 2 == len(tasks)
    assert [list(t.indices) for t in tasks] == [[10, 11, 12], [13, 14, 15]]
    assert [t.start for t in tasks] == [0, 3]
    assert [t.spans for t in tasks] == [((0, 10, 13),), ((0, 13, 16),)]
    assert all(t.seed == 7 for t in tasks)


def test_tasks_go_to_the_least_busy_worker_that_takes_tasks():
    book = book_with_workers(n_workers=2, max_tasks=2)
    keys = [key for _, assigned in (open_and_assign(book, i, 4)
                                    for i in range(2)) for key, _ in assigned]
    assert keys == [0, 1, 0, 1]
    assert book.accepting() == []          # both reached max_tasks
    _, assigned = open_and_assign(book, 8, 4)
    assert [key for key, _ in assigned] == [None, None]
    assert len(book.take_unassigned()) == 2


def test_results_in_any_order_leave_batches_in_order():
    book = book_with_workers()
    batches = [open_and_assign(book, 4 * i, 4) for i in range(3)]
    ready = []
    for b, assigned in reversed(batches):
        for key, task in reversed(assigned):
            ready += book.on_result(key, *result(task))
    assert [b.seq for b in ready] == [0, 1, 2]
    assert all(len(b.results) == b.n_chunks for b in ready)


def test_results_of_an_older_generation_are_dropped():
    book = book_with_workers()
    _, assigned = open_and_assign(book, 0, 4)
    book.new_generation()
    assert all(book.on_result(key, *result(task)) == []
               for key, task in assigned)
    batch, assigned = open_and_assign(book, 0, 4)
    ready = []
    for key, task in assigned:
        ready += book.on_result(key, *result(task))
    assert ready == [batch]


def test_workers_load_times_add_up():
    """A result carries how long the worker took (for stats); results of
    an older generation are not counted."""
    book = book_with_workers()
    _, assigned = open_and_assign(book, 0, 4)
    for key, task in assigned:
        book.on_result(key, *result(task, ('metas', None, 0.25)))
    assert book.meter.sample.load_s == 0.25 * len(assigned)
    _, assigned = open_and_assign(book, 4, 4)
    book.new_generation()
    for key, task in assigned:
        book.on_result(key, *result(task, ('metas', None, 1.0)))
    assert book.meter.sample.load_s == 0.25 * len(assigned)


def test_a_death_counts_only_against_the_batch_being_loaded():
    book = book_with_workers(n_workers=1, n_jobs_ahead=4)
    batches = [open_and_assign(book, 4 * i, 4)[0] for i in range(4)]
    book.add_worker(1)
    exit = book.worker_exited(0, -9, 'died with signal 9')
    assert exit.unexpected and exit.ready == []
    assert [b.deaths for b in batches] == [1, 0, 0, 0]
    assert [t.seq for t in exit.lost] == [0, 1, 2, 3]   # all loaded again


def test_three_deaths_on_one_batch_fail_it_and_only_it():
    book = book_with_workers(n_workers=1, n_jobs_ahead=2)
    first, _ = open_and_assign(book, 0, 4)
    second, _ = open_and_assign(book, 4, 4)
    for key in range(3):
        exit = book.worker_exited(key, -9, '(pid 1) died with signal 9')
        book.add_worker(key + 1)
        for task in exit.lost:
            book.assign(task)
    assert exit.ready == [first]
    assert isinstance(first.failure, WorkerDiedError)
    assert '[0, 1, 2, 3]' in str(first.failure)
    assert second.failure is None and second.seq in book.inflight


def test_a_retired_worker_with_nothing_current_exits_quietly():
    book = book_with_workers()
    open_and_assign(book, 0, 4)
    book.retire(0)
    book.new_generation()
    assert book.accepting() == [1]
    exit = book.worker_exited(0, 0, 'exited')
    assert not exit.unexpected and exit.lost == []


def test_a_failure_fails_every_batch_now_and_later():
    book = book_with_workers()
    open_and_assign(book, 0, 4)
    cause = OSError('no GPU')
    ready = book.fail_all('could not start', cause)
    assert len(ready) == 1 and isinstance(ready[0].failure, ChainiterError)
    assert ready[0].failure.__cause__ is cause
    batch, tasks = book.open_batch(step(4, 4), 0, None, None, -1, -1)
    assert tasks == []
    assert book.ready_failed(batch) == [batch]
    assert 'could not start' in str(batch.failure)


def test_slots_stay_busy_while_a_task_may_write_into_them():
    book = book_with_workers()
    batch, tasks = book.open_batch(step(0, 4), 0, 'slot', 'buffers', 3, 0)
    keys = [book.assign(task) for task in tasks]
    assert book.busy_slots(0) == {3} and book.busy_slots(1) == set()
    book.new_generation()       # the tasks may still be writing
    assert book.busy_slots(0) == {3}
    for key, task in zip(keys, tasks):
        book.on_result(key, *result(task))
    assert book.busy_slots(0) == set()


def test_a_seeded_task_travels_as_its_orders_keys_not_its_indices():
    """The worker computes a seeded step's indices (the main process never
    does); other orders' tasks carry the indices."""
    from chainiter.iterators._state import IteratorState, advance
    from chainiter.iterators.pipeline.processes.wire import (
        Task, decode_task, encode_task)
    from chainiter.iterators.order_samplers import SeededPermutation
    n = 10 ** 8

    def next_order(order, position, epoch):
        return SeededPermutation(3, epoch, n), None

    state = IteratorState(n - 1000, 0, False, SeededPermutation(3, 0, n))
    _, step = advance(state, 4096, True, n, next_order)    # two epochs
    seeded = encode_task(Task(0, 0, 0, 0, step, -1, -1, 3))
    as_array = Step(numpy.asarray(step.indices), step.spans)
    explicit = encode_task(Task(0, 0, 0, 0, as_array, -1, -1, 3))
    assert len(seeded) < 300 < 8 * 4096 < len(explicit)
    for message in (seeded, explicit):
        task = decode_task(pickle.loads(message))
        assert task.indices == step.indices.tolist()
        assert task.spans == step.spans


# ---- how many workers take tasks --------------------------------------------

def run_window(active, waited_every=None, load_per_batch=0.0,
               period=0.001, now=0.0, load=0.0, loaded=0, size=32,
               queued_per_batch=0.0):
    """One window of ADAPT_BATCHES batches of ``size`` examples handed out
    every ``period`` seconds, each costing the workers ``load_per_batch``
    seconds (its results arriving as it is handed out, unless
    ``load_per_batch`` is 0: none arrive) and ``queued_per_batch`` seconds
    of waiting for a CPU; every ``waited_every``-th found no batch ready.
    Returns (count, now, load, loaded)."""
    from chainiter.iterators.pipeline.flow.active_workers import ADAPT_BATCHES
    count = None
    for i in range(ADAPT_BATCHES):
        now += period
        if load_per_batch:
            load += load_per_batch
            loaded += size
        waited = waited_every is not None and i % waited_every == 0
        count = active.batch(waited, now, load, loaded, size,
                             queued_per_batch * (loaded // size))
    return count, now, load, loaded


def test_all_workers_take_tasks_until_a_window_is_measured():
    from chainiter.iterators.pipeline.flow.active_workers import ActiveWorkers
    active = ActiveWorkers(16)
    assert active.batch(False, 0.0, 0.0, 0, 32) == 16
    assert active.batch(False, 0.001, 0.0, 0, 32) == 16


def test_a_slow_consumer_keeps_as_many_workers_as_the_loading_needs():
    from chainiter.iterators.pipeline.flow.active_workers import ActiveWorkers
    active = ActiveWorkers(16)
    active.batch(False, 0.0, 0.0, 0, 32)
    # Each batch loads in 0.3 ms and is taken every 1 ms: 0.3 workers
    # busy on average; 1.5 times that plus one, at least two, reached by
    # halving a window at most.
    counts, now, load, loaded = [], 0.0, 0.0, 0
    for _ in range(4):
        count, now, load, loaded = run_window(
            active, load_per_batch=0.0003, now=now, load=load, loaded=loaded)
        counts.append(count)
    assert counts == [8, 4, 2, 2]
    # 4 ms of loading a batch each 1 ms: 4 busy, 7 take tasks.
    count, _, _, _ = run_window(active, load_per_batch=0.004, now=now,
                                load=load, loaded=loaded)
    assert count == 7


def test_waiting_for_batches_doubles_the_workers_up_to_all():
    from chainiter.iterators.pipeline.flow.active_workers import ActiveWorkers
    active = ActiveWorkers(16)
    active.batch(False, 0.0, 0.0, 0, 32)
    now, load, loaded = 0.0, 0.0, 0
    for _ in range(3):
        count, now, load, loaded = run_window(
            active, load_per_batch=0.0003, now=now, load=load, loaded=loaded)
    assert count == 2
    counts = []
    for _ in range(4):
        count, now, load, loaded = run_window(
            active, waited_every=4, load_per_batch=0.0003, now=now,
            load=load, loaded=loaded)
        counts.append(count)
    assert counts == [4, 8, 16, 16]


def test_waits_double_no_workers_that_already_wait_for_cpus():
    # 16 workers on 2 cores: next() waits now and then because a worker
    # with its batch waits for a core, not for want of workers.  Each
    # batch costs 0.3 ms of loading and 0.2 ms waiting for a CPU: the
    # count follows the loading, as if nothing waited.
    from chainiter.iterators.pipeline.flow.active_workers import ActiveWorkers
    active = ActiveWorkers(16)
    active.batch(False, 0.0, 0.0, 0, 32)
    counts, now, load, loaded = [], 0.0, 0.0, 0
    for _ in range(4):
        count, now, load, loaded = run_window(
            active, waited_every=4, load_per_batch=0.0003,
            queued_per_batch=0.0002, now=now, load=load, loaded=loaded)
        counts.append(count)
    assert counts == [8, 4, 2, 2]
    # Waits for CPUs under a quarter of the loading (I/O, say) are no
    # crowd: the waits of next() double the workers again.
    count, _, _, _ = run_window(
        active, waited_every=4, load_per_batch=0.0003,
        queued_per_batch=0.00005, now=now, load=load, loaded=loaded)
    assert count == 4


def test_workers_beyond_twice_the_cpus_stop_when_the_first_batch_waited():
    # 16 workers on 2 CPUs: the first batch's loading waited for CPUs
    # longer than a quarter of it (0.06 s against 0.04 s), so 4 take
    # tasks.  All 16 cutting the first 38 MB batches among them took
    # twice as long to reach full speed.
    from chainiter.iterators.pipeline.flow.active_workers import ActiveWorkers

    def first(n, cpus, queued_s):
        return ActiveWorkers(n, cpus).batch(False, 0.0, 0.04, 32, 32,
                                            queued_s)

    assert first(16, 2, 0.06) == 4
    assert first(16, 1, 0.06) == 2
    assert first(3, 1, 0.06) == 2
    assert first(4, 2, 0.06) == 4
    assert first(16, 8, 0.06) == 16
    assert first(16, None, 0.06) == 16
    # Workers that wait on I/O hardly wait for CPUs: all stay.
    assert first(16, 2, 0.005) == 16


def test_workers_stopped_at_the_first_batch_join_again_when_needed():
    from chainiter.iterators.pipeline.flow.active_workers import ActiveWorkers
    active = ActiveWorkers(16, cpus=2)
    assert active.batch(False, 0.0, 0.04, 32, 32, 0.06) == 4
    # Then the windows decide as for any count: a window in which next()
    # waited, the workers no longer waiting for CPUs (they wait on I/O
    # now, say), doubles them.
    from chainiter.iterators.pipeline.flow.active_workers import ADAPT_BATCHES
    counts = []
    for i in range(1, ADAPT_BATCHES + 1):
        counts.append(active.batch(i % 4 == 0, 0.01 * i, 0.04 + 0.01 * i,
                                   32 * (i + 1), 32, 0.06))
    assert counts[:-1] == [4] * (ADAPT_BATCHES - 1)
    assert counts[-1] == 8


def test_workers_capped_by_a_first_batch_that_misled_grow_within_batches():
    # The first batch waited for CPUs (workers still starting, say), but
    # then every next() waits and the 4 workers do not wait for CPUs: they
    # wait on I/O.  The count doubles every GROW_BATCHES batches, not
    # every window.
    from chainiter.iterators.pipeline.flow.active_workers import (
        ActiveWorkers, GROW_BATCHES)
    active = ActiveWorkers(16, cpus=2)
    assert active.batch(False, 0.0, 0.04, 32, 32, 0.06) == 4
    counts = []
    for i in range(1, 2 * GROW_BATCHES + 2):
        counts.append(active.batch(True, 0.01 * i, 0.04 + 0.1 * i,
                                   32 * (i + 1), 32, 0.06))
    assert counts == [4] * (GROW_BATCHES - 1) + [8] * GROW_BATCHES + \
        [16, 16]


def test_workers_that_wait_for_cpus_after_the_first_batch_stay_capped():
    from chainiter.iterators.pipeline.flow.active_workers import (
        ActiveWorkers, ADAPT_BATCHES)
    active = ActiveWorkers(16, cpus=2)
    assert active.batch(False, 0.0, 0.04, 32, 32, 0.06) == 4
    # Every next() waits, but the workers wait for CPUs as long as they
    # load: 4 take tasks until the window decides.
    counts = [active.batch(True, 0.01 * i, 0.04 + 0.01 * i, 32 * (i + 1),
                           32, 0.06 + 0.01 * i)
              for i in range(1, ADAPT_BATCHES)]
    assert set(counts) == {4}


def test_a_deep_pipeline_keeps_every_worker():
    # With more batches in flight than workers, the few workers would
    # hold the tasks of all of them, and those stay with them when more
    # join: the first batch's cap is lifted, or never set.
    from chainiter.iterators.pipeline.flow.active_workers import (
        ActiveWorkers)
    from chainiter.iterators.pipeline.flow.book import Book
    from chainiter.iterators.pipeline.flow.load_meter import Sample
    book = Book(16, 1, None, cpus=2)
    book.meter.sample = Sample(0.04, 0, 0.06)
    book.handed_out(False, 0.0, 32)
    assert book.active == 4
    book.set_depth(64)
    assert book.active == 16
    book = Book(16, 64, None, cpus=2)
    book.meter.sample = Sample(0.04, 0, 0.06)
    book.handed_out(False, 0.0, 32)
    assert book.active == 16
    # A shallow depth keeps the cap.
    book = Book(16, 4, None, cpus=2)
    book.meter.sample = Sample(0.04, 0, 0.06)
    book.handed_out(False, 0.0, 32)
    book.set_depth(4)
    assert book.active == 4
    assert ActiveWorkers(16, 2).deep() == 16


def test_a_single_worker_stays():
    from chainiter.iterators.pipeline.flow.active_workers import ActiveWorkers
    active = ActiveWorkers(1)
    active.batch(False, 0.0, 0.0, 0, 32)
    assert run_window(active)[0] == 1


def test_tasks_go_to_the_first_active_workers_only():
    book = book_with_workers(n_workers=4, n_jobs_ahead=8)
    book.active = 2
    keys = [open_and_assign(book, 4 * i, 4)[1][0][0] for i in range(6)]
    assert set(keys) == {0, 1}
    book.retire(0)                 # the next accepting worker steps in
    keys = [open_and_assign(book, 100 + 4 * i, 4)[1][0][0]
            for i in range(4)]
    assert set(keys) == {1, 2}


def test_a_window_that_drains_loaded_batches_keeps_every_worker():
    # Batches loaded before the window began (the consumer paused, or the
    # reorderer held them behind a late one) are handed out in a burst:
    # found ready, yet the consumer is the faster side.  Their loading
    # seconds arrived in earlier windows; this window's few results say
    # nothing about how many workers the consumer needs.
    from chainiter.iterators.pipeline.flow.active_workers import ActiveWorkers
    active = ActiveWorkers(16)
    active.batch(False, 0.0, 0.0, 0, 32)
    # Loader-bound: 16 workers, 160 ms a batch of 32, one batch each 10 ms.
    count, now, load, loaded = run_window(active, waited_every=1,
                                          load_per_batch=0.16, period=0.01)
    assert count == 16
    # 64 ready batches taken in 6 ms, no result arriving meanwhile.
    count, _, _, _ = run_window(active, period=0.0001, now=now, load=load,
                                loaded=loaded)
    assert count == 16
