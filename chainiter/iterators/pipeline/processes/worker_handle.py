"""The pool's handle on one worker process: its socket, its outbox, and
which layout and slots it has been sent."""

from chainiter.iterators.pipeline.processes.outbox import Outbox
from chainiter.iterators.pipeline.processes.wire import encode_task


class Worker:
    """A worker process as the pool sees it."""

    def __init__(self, worker_id, launched):
        self.id = worker_id
        self.key = launched.key
        self.conn = launched.conn
        self.outbox = Outbox(launched.conn)
        self.at_eof = False    # its end of the socket is closed
        self.buffer_id = -1    # the buffers whose layout it was sent
        self.has_slots = set()  # the SharedBuffers it was sent
        self.started = False   # it said so: Python got it to worker_main

    @staticmethod
    def start():
        """The process runs already (a thread's handle starts it here)."""

    def send_task(self, task, buffers):
        """Send a task; first the layout and the slot's memory (a message,
        then the file descriptor itself) if the worker lacks them.
        ``buffers``: those of the task's slot, or None (it has none)."""
        if buffers is not None:
            shared = buffers.slots[task.slot].shared
            if shared not in self.has_slots:
                if self.buffer_id != buffers.id:
                    self.outbox.put_object(('layout', buffers.id,
                                            buffers.layout))
                    self.buffer_id = buffers.id
                    self.has_slots = set()
                self.outbox.put_object(('slot', buffers.id, task.slot,
                                        shared.size))
                self.outbox.put_fd(shared)
                self.has_slots.add(shared)
        self.outbox.put(encode_task(task))

    def close(self):
        self.outbox.close()
        self.conn.close()
