"""The master's fds are a budget it keeps (issue 19, finding 3).

Some facts that shaped it (libzmq 4.3.5, Linux):

- libzmq accepts a control client (`sockherd ctl`, an event subscriber)
  in its own I/O thread, with no say of ours; its ipc listener treats
  EMFILE as impossible (`errno_assert` in ipc_listener.cpp accept(): only
  EAGAIN, EINTR, ECONNABORTED, EPROTO, ENFILE are allowed) and aborts the
  whole process: exit 134, every worker gone with it (PDEATHSIG). So libzmq
  must never be the one to meet a full fd table: everything the master
  accepts on its own (the metrics listener, the hand-off socket) stops
  accepting while fewer than its floor of fds are free, and RESERVE fds stay
  free for what must always work: a control client, a spawn (a socketpair
  and subprocess's pipe), an answer to /-/ready.
- The kernel gives the lowest free number, so a table fills from the
  bottom: fewer than k free numbers below the limit means some fd is open
  among the top k numbers. Hence a cheap check (`free_at_least`): one
  poll() over the top window of numbers, whose closed ones come back
  POLLNVAL; k or more of them free means k or more free at all. Only when
  that window is crowded is /proc/self/fd counted (tens of ms at 20,000
  fds: never on every accept), and that count is kept COUNT_AGE seconds.
- A recvmsg() with room for n fds installs up to n before the receiver can
  look at them (the kernel stops at EMFILE with MSG_CTRUNC, the ones
  installed stay): a reader of SCM_RIGHTS needs n free beyond its floor.
- The soft RLIMIT_NOFILE is often far below the hard one (1024 against
  524288 under systemd): the master raises its own to the hard limit at
  start. Workers keep the soft limit the master was started with (ENV_SOFT,
  kept across an upgrade's exec): their fd tables are sized by it
  (fdcore/table.py default_maxfd), and a hard limit of 2**20 would cost
  each worker tens of MB it never asked for.
- SPARE fds (/dev/null) are held open: a spawn that meets EMFILE anyway
  (something unchecked ate the reserve) closes them, tries once more, and
  takes them back.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import select
import threading
import time

from sockherd.ipc.frames import FD_BATCH

log = logging.getLogger("sockherd.master")

RESERVE = 16          # free for a control client, a spawn, a /-/ready answer
METRICS_FLOOR = RESERVE + 16     # the metrics listener accepts only above this
# the hand-off socket: one read may bring FD_BATCH fds, one accept burst its
# backlog (16); it stops first, so the metrics listener still answers /-/ready
HANDOFF_FLOOR = METRICS_FLOOR + FD_BATCH + 32
SPARE = 4
COUNT_AGE = 0.5       # seconds an exact count of the open fds is trusted
ENV_SOFT = "SOCKHERD_WORKER_NOFILE"   # the soft limit workers get
# what a fork, a socketpair or a pipe says when the master itself is short
SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})


def raise_soft_limit() -> None:
    """RLIMIT_NOFILE's soft limit up to the hard one (said once, at INFO);
    the soft limit the master started with is kept for its workers."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    os.environ.setdefault(ENV_SOFT, str(soft))      # an upgrade's exec: the first image's
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return
    target = hard if hard != resource.RLIM_INFINITY else max(soft, _nr_open())
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("fds: soft limit %d kept (raising it to %d failed: %s)", soft, target, exc)
        return
    log.info("fds: soft limit raised from %d to %d", soft, target)


def worker_soft_limit() -> int | None:
    """The soft RLIMIT_NOFILE a worker gets (None: the master's own)."""
    try:
        return int(os.environ[ENV_SOFT])
    except (KeyError, ValueError):
        return None


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


class Budget:
    """The open-fd check and the spare fds; one per process (BUDGET), read
    from the loop and from the metrics thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._limit = -1
        self._window: select.poll | None = None
        self._window_size = 0
        self._counted_at = -COUNT_AGE
        self._open = 0
        self._spare: list[int] = []

    def limit(self) -> int:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return soft if soft != resource.RLIM_INFINITY else _nr_open()

    def free_at_least(self, k: int) -> bool:
        """Whether k or more fd numbers below the limit are free (see the
        top: a poll over the top 2k numbers, else a count kept COUNT_AGE s)."""
        with self._lock:
            limit = self.limit()
            size = min(2 * k, limit - 3)          # 0-2: stdio, never ours to count
            if limit != self._limit or size != self._window_size:
                self._window = select.poll()
                for fd in range(limit - size, limit):
                    self._window.register(fd, 0)
                self._limit, self._window_size = limit, size
            closed = sum(1 for _, ev in self._window.poll(0) if ev & select.POLLNVAL)
            if closed >= k:
                return True
            now = time.monotonic()
            if now - self._counted_at > COUNT_AGE:
                self._open = len(os.listdir("/proc/self/fd")) - 1   # less listdir's own
                self._counted_at = now
            return limit - self._open >= k

    def taken(self, n: int = 1) -> None:
        """n fds opened since the last count (an accept that was let in):
        counted until the next count (closes are not: conservative)."""
        with self._lock:
            self._open += n

    # ---- the spare fds ---------------------------------------------------------------------
    def hold_spare(self) -> None:
        """Opens the spare fds (at start, and after each use)."""
        while len(self._spare) < SPARE:
            try:
                self._spare.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                return                               # taken back later, when there is room

    @contextlib.contextmanager
    def spare_released(self):
        """The spare fds closed for the body (a spawn's retry after EMFILE),
        opened again after it."""
        for fd in self._spare:
            os.close(fd)
        self._spare.clear()
        try:
            yield
        finally:
            self.hold_spare()


BUDGET = Budget()
