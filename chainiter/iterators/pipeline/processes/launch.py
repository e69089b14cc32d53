"""Starting worker processes, and learning when they exit.

Two launchers with one interface: ``start(worker_id, incarnation)`` returns
a ``Launched`` (its ``conn`` is the parent's end of the worker's socket,
usable at once), ``watched()`` lists what the receiver thread must wait on,
and ``exits(ready)`` turns the ones that were ready into ``(launched,
exitcode)``.

- ``ProcessLauncher`` (spawn, forkserver): one ``Process`` per worker.  These
  start methods never fork the calling process, so any thread may start a
  worker.  Each gets the pool's one pickle of the dataset (share.py): the
  dataset as it was at the first start.
- ``ForkLauncher`` (fork): a helper process, forked once when the pool starts
  (before its receiver thread exists), forks every worker, the replacements
  of dead workers included.  Forking a process that has other threads may
  deadlock the child (Python 3.12+ warns); the helper never has any.  Its
  workers see the dataset as it was when the pool started.
"""

import array
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import threading
import time

from chainiter.iterators.pipeline.processes import (
    worker as _worker, worker_process)

_JOIN_TIMEOUT_S = 1.0     # then terminate, then kill

_WORKER_NAME = 'chainiter-worker-'


def refuse_in_bootstrap(method):
    """Raise when a worker of ours is bootstrapping, importing the main
    script again (spawn, forkserver), and the script builds an iterator
    at top level: multiprocessing refuses to start a process there, with
    a 40-line traceback from each worker.  Worker 0 raises a short error
    instead (it names the script's line, and the fix); the others exit
    quietly (exit code 1 all the same: the main process tells the user).
    Under fork nothing is refused: multiprocessing allows it."""
    current = multiprocessing.current_process()
    if method == 'fork' or not getattr(current, '_inheriting', False) or \
            not current.name.startswith(_WORKER_NAME):
        return
    if current.name != _WORKER_NAME + '0':
        raise SystemExit(1)
    raise RuntimeError(
        'a MultiprocessIterator was built while {} started: under the {!r} '
        'start method each worker first runs the main script again (as '
        '__mp_main__), and this script builds the iterator at top level, '
        'outside "if __name__ == \'__main__\':". Put the script\'s code '
        'under that guard, or use start_method="fork"'.format(
            current.name, method))


class Launched:
    """A started worker process, as the pool sees it."""

    def __init__(self, key, conn, process=None):
        self.key = key
        self.conn = conn
        self.process = process          # ProcessLauncher only
        self.pid = None if process is None else process.pid
        self.exitcode = None


def stop(processes, timeout=_JOIN_TIMEOUT_S):
    """Join, then terminate, then kill: every process has exited on return."""
    for how in (None, 'terminate', 'kill'):
        deadline = time.monotonic() + timeout
        for process in processes:
            if how is not None and process.is_alive():
                getattr(process, how)()
            process.join(None if how == 'kill' else
                         max(0.0, deadline - time.monotonic()))


def _worker_args(pool_args, worker_id, incarnation, conn, parent_pid,
                 by_main_thread):
    dataset, seed, n_workers, worker_init_fn, max_tasks = pool_args
    return (conn, dataset, seed, worker_id, incarnation, n_workers,
            worker_init_fn, parent_pid, max_tasks, by_main_thread)


def _exitcode(process):
    """The exit code of a process that has exited.  Another thread's
    ``multiprocessing.active_children()`` may have reaped it, and records
    its status a moment after our own wait found none: wait for that."""
    deadline = time.monotonic() + 1.0
    code = process.exitcode
    while code is None and time.monotonic() < deadline:
        time.sleep(0.001)
        code = process.exitcode
    return code


class ProcessLauncher:

    def __init__(self, ctx, pool_args):
        self._ctx = ctx
        self._args = pool_args
        self._next_key = 0
        self._running = {}     # sentinel -> Launched

    def start(self, worker_id, incarnation):
        parent_conn, child_conn = self._ctx.Pipe()
        process = self._ctx.Process(
            target=_worker.worker_main,
            name='chainiter-worker-{}'.format(worker_id),
            args=_worker_args(
                self._args, worker_id, incarnation, child_conn, os.getpid(),
                threading.current_thread() is threading.main_thread()),
            daemon=True)
        try:
            process.start()
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()
        launched = Launched(self._next_key, parent_conn, process)
        self._next_key += 1
        self._running[process.sentinel] = launched
        return launched

    def watched(self):
        return list(self._running)

    def exits(self, ready):
        out = []
        for sentinel in ready:
            launched = self._running.pop(sentinel, None)
            if launched is not None:
                launched.process.join()
                launched.exitcode = _exitcode(launched.process)
                out.append(launched)
        return out

    alive = True

    def processes(self):
        """What multiprocessing counts as this process's children."""
        return [launched.process for launched in self._running.values()]

    def close(self):
        stop(self.processes())
        self._running = {}


class ForkLauncher:

    def __init__(self, ctx, pool_args):
        self._control, theirs = socket.socketpair()
        self._control_lock = threading.Lock()
        self._next_key = 0
        self._starting = {}    # key -> Launched, until its pid is known
        self._running = {}     # key -> Launched
        self._buffer = b''
        self.process = ctx.Process(
            target=_launcher_main, name='chainiter-launcher',
            args=(theirs, pool_args, os.getpid(),
                  threading.current_thread() is threading.main_thread()),
            daemon=True)
        self.process.start()
        theirs.close()

    def start(self, worker_id, incarnation):
        ours, theirs = socket.socketpair()
        key = self._next_key
        self._next_key += 1
        with self._control_lock:
            _send_fd(self._control, '{} {} {}\n'.format(
                key, worker_id, incarnation).encode(), theirs.fileno())
        theirs.close()
        conn = multiprocessing.connection.Connection(ours.detach())
        launched = Launched(key, conn)
        self._running[key] = launched
        return launched

    def watched(self):
        return [self._control, self.process.sentinel]

    def exits(self, ready):
        """The workers that exited; when the helper itself died, all of
        them (they die with it)."""
        out = []
        if self._control in ready:
            try:
                data = self._control.recv(65536)
            except OSError:
                data = b''
            self._buffer += data
            *lines, self._buffer = self._buffer.split(b'\n')
            for line in lines:
                what, key, value = line.split()
                launched = self._running.get(int(key))
                if launched is None:
                    continue
                if what == b'started':
                    launched.pid = int(value)
                else:
                    launched.exitcode = int(value)
                    out.append(self._running.pop(int(key)))
        if self.process.sentinel in ready:
            self.process.join()
            for launched in self._running.values():
                launched.exitcode = -signal.SIGKILL
                out.append(launched)
            self._running = {}
        return out

    @property
    def alive(self):
        return self.process.is_alive()

    def processes(self):
        return [self.process]

    def close(self):
        """The helper stops its workers (which the pool has told to exit),
        then exits."""
        with self._control_lock:
            try:
                self._control.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        stop([self.process], timeout=3 * _JOIN_TIMEOUT_S)
        self._control.close()
        self._running = {}


def _send_fd(sock, data, fd):
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                           array.array('i', [fd]))])


def _recv_line_and_fd(sock):
    """One request: a line, the worker's socket with its first byte."""
    fds = array.array('i')
    data, ancdata, _, _ = sock.recvmsg(
        4096, socket.CMSG_SPACE(fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def _launcher_main(control, pool_args, parent_pid, by_main_thread):
    """The helper: fork a worker for each request, report every exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # No thread: it forks, and a fork must find it single-threaded.
    worker_process.watch_parent(parent_pid, by_main_thread, thread=False)
    # Its workers are daemonic processes of its own, which multiprocessing
    # refuses to a daemonic process; it ends them itself.
    multiprocessing.current_process()._config['daemon'] = False
    ctx = multiprocessing.get_context('fork')
    running = {}       # sentinel -> (key, Process)
    pending = b''
    while worker_process.alive(parent_pid):
        ready = multiprocessing.connection.wait(
            [control] + list(running), worker_process.PARENT_CHECK_S)
        for sentinel in ready:
            if sentinel in running:
                key, process = running.pop(sentinel)
                process.join()
                _report(control, 'exited', key, process.exitcode)
        if control not in ready:
            continue
        data, fds = _recv_line_and_fd(control)
        if not data:
            break      # the pool closed
        pending += data
        *lines, pending = pending.split(b'\n')
        for line, fd in zip(lines, fds):
            key, worker_id, incarnation = map(int, line.split())
            conn = multiprocessing.connection.Connection(fd)
            process = ctx.Process(
                target=_run_worker, name='chainiter-worker-{}'.format(
                    worker_id),
                args=(control, _worker_args(pool_args, worker_id,
                                            incarnation, conn, os.getpid(),
                                            True)),
                daemon=True)
            process.start()
            conn.close()
            running[process.sentinel] = (key, process)
            _report(control, 'started', key, process.pid)
    stop([process for _, process in running.values()])


def _report(control, what, key, value):
    try:
        control.sendall('{} {} {}\n'.format(what, key, value).encode())
    except OSError:
        pass      # the pool is gone; the next wait sees the end


def _run_worker(control, args):
    control.close()        # the helper's, not the worker's
    _worker.worker_main(*args)
