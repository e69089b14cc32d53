"""The process boundary: worker processes, their messages, the receiver
thread, shared memory files, the dataset sent to spawned workers; and
``MultiprocessIterator``."""
