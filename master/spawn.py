"""Starting one worker process: fork+exec of `python -m sockherd.worker`.

The master is multi-threaded under the hood (ZeroMQ's I/O thread), so it never
plain-forks: subprocess starts a fresh interpreter, which inherits exactly one
fd (its end of a new socketpair, `pass_fds`); everything else the master holds
is close-on-exec. The first message on the socketpair is the Assignment, with
the listener fds attached (SCM_RIGHTS, duplicates: the master keeps its own).
Call it from the master's main thread: the worker's PR_SET_PDEATHSIG fires
when the thread that spawned it exits.

A worker's environment is the master's less what systemd meant for the master
alone (MASTER_ONLY): NOTIFY_SOCKET stays in the master's own environment (it
notifies across its re-exec: master/notify.py), but an app calling sd_notify
in a worker must not speak for the service; the watchdog variables name the
master's pid. (LISTEN_* are gone already: master/listeners.py activated().)

A start that fails for the master's own resources (EMFILE, ENFILE, ENOMEM,
EAGAIN from the socketpair or the fork) raises Shortage: the worker did
nothing wrong, and its slot must not come closer to being given up
(issue 19, finding 3: a short fd squeeze during a crash removed the slot
for good). On EMFILE the spare fds (fdbudget.py) are let go for one more try.
A worker gets the soft RLIMIT_NOFILE the master was started with
(fdbudget.worker_soft_limit), which it sets itself, first thing (an env var:
lowered from outside, a process holding fds above the limit may break).
"""
from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

from sockherd.ipc.channel import Channel
from sockherd.ipc.messages import Assignment
from sockherd.master.fdbudget import BUDGET, ENV_SOFT, SHORTAGE, worker_soft_limit
from sockherd.master.listeners import Listener
from sockherd.worker import ENV_BOARD, ENV_FD, ENV_MASTER, ENV_NOFILE

MASTER_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC", ENV_SOFT,
               # the TLS key's password, as the settings' help suggests giving
               # it: the master reads it and ships it to the engine (master/
               # tls.py files()); in a worker's environment the app would
               # have it (issue 35 review 3)
               "SOCKHERD_KEYFILE_PASSWORD")
# bytes of a worker's channel read per wake-up of the master's loop: about
# 2,000 of its smallest messages, a few ms of handling
READ_BYTES = 64 * 1024


class Shortage(OSError):
    """The master itself is short of fds, memory or processes: not the
    worker's failure (the errno and strerror are the original's)."""


@dataclass
class WorkerProcess:
    """A worker process: started here, or adopted across an upgrade (the
    same pid's child still, but no Popen of this image knows it)."""
    generation: int
    index: int
    pid: int
    channel: Channel
    # kept while the process lives: a Popen collected early puts its pid on
    # subprocess's list of children to reap, and the next Popen reaps it
    # behind the supervisor's back (its exit, and its socketpair's close,
    # would be lost: found as an fd leak across reloads)
    popen: subprocess.Popen | None = None
    returncode: int | None = None

    @property
    def proc(self) -> subprocess.Popen | None:
        """The Popen of a worker started by this image (None if adopted)."""
        return self.popen

    def exited(self, code: int) -> None:
        self.returncode = code
        if self.popen is not None:
            self.popen.returncode = code           # reaped: nothing for subprocess to do


def adopt(generation: int, index: int, pid: int, fd: int) -> WorkerProcess:
    """A worker the previous master image started (upgrade): fd is the
    master's end of its socketpair, inherited across exec."""
    return WorkerProcess(generation, index, pid, _channel(socket.socket(fileno=fd)))


def _channel(sock: socket.socket) -> Channel:
    """The master's end of a worker's socketpair. A worker never sends the
    master an fd: any it sends are refused and discarded by the kernel,
    never held (app code could fill the table). And one wake-up of the
    loop reads at most READ_BYTES of it: a worker writing small messages as
    fast as it can cost a decode and a handling of half a million of them
    per wake-up, and `ctl status` waited 3-5 s (the selector reports the rest
    again, after the other fds)."""
    return Channel(sock, takes_fds=False, read_bytes=READ_BYTES)


def spawn(generation: int, index: int, config: dict, app: str, listeners: list[Listener],
          *, send_timeout: float = 10.0, board_fd: int = -1, board_row: int = -1) -> WorkerProcess:
    """Starts worker generation.index and sends its assignment. On a failure
    to send, the new process is killed and reaped before the error propagates;
    a failure of the master's own resources raises Shortage."""
    try:
        return _spawn(generation, index, config, app, listeners, send_timeout, board_fd,
                      board_row)
    except OSError as exc:
        if exc.errno not in (errno.EMFILE, errno.ENFILE):
            raise _shortage(exc)
    with BUDGET.spare_released():          # something ate the reserve: the spares, once
        try:
            return _spawn(generation, index, config, app, listeners, send_timeout, board_fd,
                          board_row)
        except OSError as exc:
            raise _shortage(exc)


def _shortage(exc: OSError) -> OSError:
    """exc as a Shortage if its errno says the master ran short, else exc."""
    if isinstance(exc, Shortage) or exc.errno not in SHORTAGE:
        return exc
    return Shortage(exc.errno, exc.strerror or str(exc))


def _spawn(generation, index, config, app, listeners, send_timeout, board_fd,
           board_row) -> WorkerProcess:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = {k: v for k, v in os.environ.items() if k not in MASTER_ONLY}
    env[ENV_FD] = str(child.fileno())
    env[ENV_MASTER] = str(os.getpid())
    soft = worker_soft_limit()
    if soft is not None:                  # the worker sets it first thing (bootstrap)
        env[ENV_NOFILE] = str(soft)
    passed = [child.fileno()]
    if board_fd >= 0:                     # the balance board (worker/board.py)
        env[ENV_BOARD] = str(board_fd)
        passed.append(board_fd)
    # USR1 (reopen the log files) starts blocked in the worker (the mask goes
    # across fork and exec): its default action would kill a worker that
    # has not set its handler yet; it unblocks it then (bootstrap.main), and
    # a USR1 sent meanwhile is delivered at that moment, not lost
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        proc = subprocess.Popen([sys.executable, "-m", "sockherd.worker"],
                                pass_fds=passed, env=env, close_fds=True)
    except BaseException:
        parent.close()
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        child.close()
    channel = _channel(parent)
    try:
        channel.send(Assignment(generation=generation, worker_index=index, config=config, app=app,
                                listeners=[lst.descriptor for lst in listeners],
                                board_slot=board_row),
                     fds=[lst.sock.fileno() for lst in listeners], timeout=send_timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        channel.close()
        raise
    return WorkerProcess(generation, index, proc.pid, channel, proc)


