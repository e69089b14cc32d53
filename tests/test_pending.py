"""The queue of batches dispatched ahead, without an iterator: what it says
of its handles, the end of the iteration and failures."""

from chainiter.iterators._pending import Failed, PendingBatches, sent


def test_handles_in_order_and_by_index():
    pending = PendingBatches([('s1', 'a'), ('s2', 'b')])
    assert pending.handles() == ['a', 'b']
    assert (pending.handle(0), pending.handle(1)) == ('a', 'b')
    assert pending.handle(2) is None
    handles = pending.handles()
    pending.popleft()
    assert handles == ['a', 'b'] and pending.handles() == ['b']


def test_closed_by_the_end_or_a_failure_only():
    pending = PendingBatches()
    assert not pending.closed()
    pending.append(('s1', 'a'))
    assert not pending.closed()
    pending.append(('s2', Failed(ValueError('bad'))))
    assert pending.closed()
    pending.pop()
    pending.append(('s2', None))
    assert pending.closed()


def test_sent_is_a_transports_handle():
    assert sent('a') and sent([])
    assert not sent(None) and not sent(Failed(KeyError()))
