"""Messages to one worker, sent without ever blocking.

A worker may be blocked writing a result that only the receiver thread
reads; a thread that waited to send it a task could then wait forever.  So
no send waits: the parent's end of the worker's socket is non-blocking,
whatever the socket does not take now stays in the outbox, in order, and the
receiver thread writes it when the socket has room again.  No estimate of
the kernel's buffers is needed.

An exception may interrupt a write after the kernel took some bytes and
before the outbox knows how many (a KeyboardInterrupt in the main thread):
the stream to that worker may then be cut in the middle of a message, and
``torn`` tells the pool to retire the worker.
"""

import array
import collections
import os
import pickle
import socket
import threading

from chainiter.iterators.pipeline.processes.wire import frame


class Outbox:

    def __init__(self, conn):
        self._fd = conn.fileno()
        os.set_blocking(self._fd, False)
        # A socket object on the same connection, for passing descriptors
        # and for the shutdown.  Made here, not where an interrupt may land
        # between its making and its use (it would be dropped unclosed).
        self._sock = socket.socket(fileno=os.dup(self._fd))
        self._sock.setblocking(False)
        # [memoryview, None or the owner of a descriptor to pass]
        self._items = collections.deque()
        self._lock = threading.Lock()
        self.torn = False
        self.dead = False               # the worker's end is closed

    def put_object(self, obj):
        return self.put(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))

    def put(self, data):
        """Queue one message and send what the socket takes; True when
        nothing is left waiting."""
        framed = frame(data)
        with self._lock:
            if self._items or self.dead or self.torn:
                self._items.append([memoryview(framed), None])
                return self._flush()
            self.torn = True            # until the count is recorded
            try:                        # the common case: nothing waits
                n = os.write(self._fd, framed)
            except BlockingIOError:
                n = 0
            except OSError:             # the worker has died
                n = len(framed)
                self.dead = True
            if n < len(framed):
                self._items.append([memoryview(framed)[n:], None])
            self.torn = False
            return n == len(framed)

    def put_fd(self, owner):
        """Queue the file descriptor ``owner.fd`` (read by
        ``multiprocessing.reduction.recv_handle``); ``owner`` keeps it open
        until it is sent.  No descriptor is made here, so an interrupt
        cannot leak one."""
        with self._lock:
            self._items.append([memoryview(b'\x01'), owner])
            return self._flush()

    def flush(self):
        with self._lock:
            return self._flush()

    def is_torn(self):
        """Whether an exception cut a write short (under the lock, so a
        write in progress in another thread does not count)."""
        with self._lock:
            return self.torn

    @property
    def pending(self):
        return bool(self._items) and not self.dead

    def _flush(self):
        if self.torn:
            # An exception cut the last write short: how much of that
            # message went is unknown, so nothing more may follow it.
            self.dead = True
            self._drop()
            return True
        items = self._items
        while items and not self.dead:
            item = items[0]
            self.torn = True            # until the count is recorded
            try:
                if item[1] is not None:
                    n = self._send_fd(item[0], item[1].fd)
                else:
                    n = os.write(self._fd, item[0])
            except BlockingIOError:
                self.torn = False
                return False
            except OSError:             # the worker has died
                self.torn = False
                self.dead = True
                break
            if n == len(item[0]):
                items.popleft()
            else:
                item[0] = item[0][n:]
            self.torn = False
        if self.dead:
            self._drop()
        return True

    def _send_fd(self, data, fd):
        n = self._sock.sendmsg([data], [(socket.SOL_SOCKET,
                                         socket.SCM_RIGHTS,
                                         array.array('i', [fd]))])
        return n

    def shut(self):
        """No more messages: the worker reads to the end of what it was
        sent (perhaps a torn message), then sees the end of the stream."""
        with self._lock:
            self.dead = True
            self._drop()
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                self._close_socket()

    def close(self):
        """Drop what waits (the worker is gone or going)."""
        with self._lock:
            self.dead = True
            self._drop()
            self._close_socket()

    def _drop(self):
        self._items.clear()

    def _close_socket(self):
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
