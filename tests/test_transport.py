"""The framing of results from a worker to the parent: every message
arrives whole and in order, however the reads cut the byte stream."""

import multiprocessing
import threading

import pytest

from chainiter.iterators.pipeline.processes.wire import (
    header, receive_results, send_frame)


def frame(seq, payload):
    return header(7, seq, 0) + payload


def read_all(conn, count):
    got = []
    while len(got) < count:
        got.extend(receive_results(conn))
    return [(g, s, c, bytes(p)) for g, s, c, p in got]


def test_small_messages_waiting_come_in_one_call_and_in_order():
    parent, child = multiprocessing.Pipe()
    for seq in range(3):
        send_frame(child, frame(seq, b'x' * seq))
    got = [(s, bytes(p)) for _, s, _, p in receive_results(parent)]
    assert got == [(0, b''), (1, b'x'), (2, b'xx')]


def test_send_frame_is_read_by_connection_recv_bytes():
    parent, child = multiprocessing.Pipe()
    send_frame(child, b'small')
    send_frame(child, b'L' * 100000)
    assert parent.recv_bytes() == b'small'
    assert parent.recv_bytes() == b'L' * 100000


def test_messages_whose_header_is_cut_by_a_read():
    parent, child = multiprocessing.Pipe()
    # Frames of 32767 bytes (4 of length, 32763 of message): the first
    # read of 65536 bytes ends 2 bytes into the length of frame 2.
    payload = b"p" * (32763 - len(header(0, 0, 0)))
    for seq in range(4):
        child.send_bytes(frame(seq, payload))
    got = read_all(parent, 4)
    assert [m[1] for m in got] == list(range(4))
    assert all(m[0] == 7 and m[3] == payload for m in got)


def test_large_message_spanning_many_reads_arrives_intact():
    parent, child = multiprocessing.Pipe()
    big = bytes(range(256)) * 20000      # 5 MB: more than a socket holds
    writer = threading.Thread(target=lambda: [
        child.send_bytes(frame(0, big)), child.send_bytes(frame(1, b'end'))])
    writer.start()
    got = read_all(parent, 2)
    writer.join(10)
    assert [m[1] for m in got] == [0, 1]
    assert got[0][3] == big and got[1][3] == b"end"


def test_a_closed_pipe_is_eof():
    parent, child = multiprocessing.Pipe()
    child.close()
    with pytest.raises(EOFError):
        receive_results(parent)
