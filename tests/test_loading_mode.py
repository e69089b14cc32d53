"""The choice of where a thread pool loads on a build with the GIL
(``flow/loading_mode.py``), pure, on a clock of the test's own: each
mode hands out batches at a rate the test sets."""

from chainiter.iterators.pipeline.flow.loading_mode import LoadingMode


class Loop:
    """A consumer that takes a batch of ``examples`` every
    ``1 / rate[mode]`` seconds, ``in_flight`` behind it, and applies what
    the choice says."""

    def __init__(self, mode, rates, in_flight=4, examples=64):
        self.mode, self.rates = mode, rates
        self.in_flight, self.examples = in_flight, examples
        self.now = 0.0
        self.switches = []     # (time, to main)
        self.batches = {False: 0, True: 0}

    def run(self, seconds):
        end = self.now + seconds
        while self.now < end:
            self.now += self.examples / self.rates[self.mode.main]
            self.batches[self.mode.main] += 1
            to = self.mode.handed_out(self.now, self.examples,
                                      self.in_flight)
            if to is not None:
                self.switches.append((self.now, to))
        return self


def _mode():
    return LoadingMode(first_probe_s=0.5, window_s=0.25, window_batches=16,
                       margin=1.05, max_interval_s=8.0)


def test_it_begins_with_the_threads_and_keeps_the_main_thread_if_faster():
    loop = Loop(_mode(), {False: 60000.0, True: 100000.0}).run(1.5)
    # One probe: threads measured, then the main thread, which is kept.
    assert [to for _, to in loop.switches] == [True]
    assert loop.mode.main is True
    assert loop.switches[0][0] >= 0.5 + 0.25
    assert abs(loop.mode.rates[False] - 60000.0) < 1.0
    assert abs(loop.mode.rates[True] - 100000.0) < 1.0


def test_a_slower_main_thread_is_tried_and_left():
    loop = Loop(_mode(), {False: 100000.0, True: 60000.0}).run(1.5)
    assert [to for _, to in loop.switches] == [True, False]
    assert loop.mode.main is False
    assert loop.mode.probes == 1


def test_the_main_thread_must_be_faster_by_the_margin():
    loop = Loop(_mode(), {False: 100000.0, True: 103000.0}).run(1.5)
    assert [to for _, to in loop.switches] == [True, False]


def test_the_batches_in_flight_at_a_switch_are_not_measured():
    # The batches already loaded by the threads come fast after the
    # switch; here they are the only thing that would make the main
    # thread look faster.
    mode = _mode()
    now, switched, rates = 0.0, None, []
    for k in range(2000):
        main = mode.main
        fast = switched is not None and k - switched <= 6
        now += 64 / (1e6 if fast else 60000.0 if main else 100000.0)
        to = mode.handed_out(now, 64, 6)
        if to is True:
            switched = k
        if to is not None:
            rates.append(to)
    assert rates == [True, False]
    assert abs(mode.rates[True] - 60000.0) < 1.0


def test_a_plainly_slower_main_thread_ends_its_window_early():
    # Images: the threads copy without the GIL, 6 times as fast.
    loop = Loop(_mode(), {False: 12000.0, True: 2000.0}).run(3.0)
    assert [to for _, to in loop.switches][:2] == [True, False]
    (on, _), (off, _) = loop.switches[:2]
    # 4 batches and the 4 in flight, not 16 or a quarter of a second.
    assert off - on <= 8 * 64 / 2000.0 + 1e-9
    assert loop.batches[True] <= 2 * 8


def test_it_probes_again_at_doubling_intervals_up_to_the_most():
    mode = _mode()
    loop = Loop(mode, {False: 100000.0, True: 60000.0}).run(40.0)
    ons = [t for t, to in loop.switches if to]
    gaps = [b - a for a, b in zip(ons, ons[1:])]
    # 1, 2, 4, 8 s after each probe's end (plus the window), then 8.
    assert len(ons) >= 6
    assert all(b >= a * 0.99 for a, b in zip(gaps, gaps[1:]))
    assert 8.0 <= gaps[-1] <= 8.0 + 1.0
    assert mode.main is False


def test_the_choice_follows_a_loop_that_changes():
    loop = Loop(_mode(), {False: 60000.0, True: 100000.0}).run(2.0)
    assert loop.mode.main is True
    # The training loop now releases the GIL: the threads win.
    loop.rates = {False: 150000.0, True: 100000.0}
    loop.run(20.0)
    assert loop.mode.main is False


def test_a_plainly_slower_threads_window_ends_early_too():
    # The main thread is measured first once it is in use.
    mode = _mode()
    loop = Loop(mode, {False: 20000.0, True: 60000.0}).run(1.5)
    assert mode.main is True
    on = len(loop.switches)
    loop.run(1.0 + 1e-3)     # the next probe: 1 s after the first's end
    (back, to_threads), (again, to_main) = loop.switches[on:on + 2]
    assert (to_threads, to_main) == (False, True)
    # 4 batches in flight, then a sixteenth of a second (the least that
    # ends early), not a quarter.
    assert again - back <= 5 * 64 / 20000.0 + 0.25 / 4 + 1e-9


def test_a_probe_plainly_lost_waits_twice_as_long_again():
    close = Loop(_mode(), {False: 100000.0, True: 70000.0}).run(30.0)
    plain = Loop(_mode(), {False: 100000.0, True: 20000.0}).run(30.0)
    probes = [len([1 for _, to in loop.switches if to])
              for loop in (close, plain)]
    # 1, 2, 4, 8, 8 ... s against 2, 8, 8 ... s apart.
    assert probes[1] < probes[0]
    gaps = [b - a for a, b in zip(*[[t for t, to in plain.switches if to]
                                    [i:] for i in (0, 1)])]
    assert gaps[0] >= 2.0
