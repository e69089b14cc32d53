"""A worker process's place beside its parent: it exits when the parent
dies (``watch_parent``, ``alive``), yields the CPUs to the trainer
(``yield_to_the_trainer``) and seeds the global RNGs a dataset may draw
from (``seed_global_rngs``).  ``worker.py`` runs the tasks."""

import ctypes
import os
import random
import signal
import sys
import threading
import time

import numpy

PARENT_CHECK_S = 0.5   # how often a worker checks that its parent lives


def watch_parent(parent_pid, by_main_thread, thread=True):
    """Exit when the parent dies, even while ``dataset[i]`` is stuck.
    Without ``thread`` the caller polls ``alive(parent_pid)`` itself."""
    # The kernel's parent-death signal fires when the THREAD that started
    # the worker ends: use it only for workers the main thread started.
    if by_main_thread and os.getppid() == parent_pid and \
            sys.platform.startswith('linux'):
        _set_parent_death_signal()   # the kernel kills us at once
    if not thread:
        return
    # Under forkserver the parent is the server, so also check by pid.

    def watch():
        while alive(parent_pid):
            time.sleep(PARENT_CHECK_S)
        os._exit(1)
    threading.Thread(target=watch, name='chainiter-parent-watch',
                     daemon=True).start()


def alive(pid):
    """False once ``pid`` has exited (a zombie counts as exited)."""
    try:
        with open('/proc/{}/stat'.format(pid), 'rb') as f:
            return f.read().rsplit(b')', 1)[1].split()[0] not in (b'Z', b'X')
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def yield_to_the_trainer():
    """Run this process under ``SCHED_BATCH`` (Linux): the same share of
    the CPUs, but a worker woken by a task no longer preempts the main
    process on a busy machine; it runs at the next scheduler tick.  With
    two workers on two cores the main thread waited for its CPU inside
    ``next()`` whenever a woken worker took it.  Elsewhere, or where it is
    refused, nothing changes; a ``worker_init_fn`` may set another
    policy."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def _set_parent_death_signal():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


#: Tags numpy's global seeds apart from the streams of order_samplers.
_NUMPY_GLOBAL_STREAM = 0x6e70676c


def seed_global_rngs(seed, stream):
    """Seed, as PyTorch's DataLoader does in its workers, the global RNGs a
    dataset may draw from: ``random`` and torch (only if already imported,
    e.g. by the dataset's module) with ``seed + stream``, numpy's from
    ``(seed, stream)`` (``stream``: ``load.worker_stream``, the worker id for
    the first workers).  So workers draw different numbers, forked ones
    too, and the same ones for the same seed.  ``example_rng()`` stays the
    exact, resumable way: these depend on which worker loads an example."""
    worker_seed = seed + stream
    random.seed(worker_seed)
    numpy.random.seed(numpy.random.SeedSequence(
        [seed, _NUMPY_GLOBAL_STREAM, stream]).generate_state(4))
    torch = sys.modules.get('torch')
    if torch is not None and hasattr(torch, 'manual_seed'):
        torch.manual_seed(worker_seed)
