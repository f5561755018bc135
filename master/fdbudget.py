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
- Counting /proc/self/fd costs about 3 us an open fd (57 ms at 19,000):
  never on every accept. The count is kept (COUNT_AGE) and what is taken
  since is added to it (`taken`: an accept let in, a control client
  ZeroMQ accepted) and what they close taken from it (`given`); other
  closes are not seen, so the estimate errs on the short side until the
  next count, a second later at most. A check is a subtraction.
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
import threading
import time
from typing import NamedTuple

from sockherd.ipc.frames import FD_BATCH
from sockherd.worker import ENV_NOFILE

log = logging.getLogger("sockherd.master")

RESERVE = 16          # free for a control client, a spawn, a /-/ready answer
SPARE = 4
COUNT_AGE = 1.0       # seconds a count of the open fds is used (with what was taken since)
ENV_SOFT = ENV_NOFILE                # the soft limit workers get (they set it themselves)
# what a fork, a socketpair or a pipe says when the master itself is short
SHORTAGE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})


class Floors(NamedTuple):
    """Free fds below which each surface stops, for one limit. The control
    endpoints are unbound below `control` (control_guard.py): a 16th of the
    table, so that what libzmq accepts between a check and the unbind (a
    burst of connects: tens in a millisecond) still leaves RESERVE; bound
    again from `control_again`, where the metrics listener stops too (a
    squeeze of metrics clients alone never keeps ctl away). The hand-off
    socket stops first: one read may bring FD_BATCH fds, one accept burst
    its backlog (16), and /-/ready must still be answered after it."""
    control: int
    control_again: int
    metrics: int
    handoff: int

    @classmethod
    def of(cls, limit: int) -> "Floors":
        control = max(RESERVE + 8, limit // 16)
        again = control + max(8, limit // 64)
        return cls(control, again, again, again + FD_BATCH + 32)


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
    """The open-fd count and the spare fds; one per process (BUDGET), read
    from the loop and from the metrics thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counted_at = -COUNT_AGE
        self._open = 0                # at the last count, plus what was taken since
        self._spare: list[int] = []

    def limit(self) -> int:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return soft if soft != resource.RLIM_INFINITY else _nr_open()

    def floors(self) -> Floors:
        """The floors for the current limit (see Floors)."""
        return Floors.of(self.limit())

    def free_at_least(self, k: int) -> bool:
        """Whether k or more fds can still be opened: from the last count
        and what was taken since, counted anew once that is COUNT_AGE old
        (a squeeze asks often: never a count each time; and a flood of
        control clients must meet the floor at the accept that crosses it,
        not after a count of thousands of fds)."""
        with self._lock:
            now = time.monotonic()
            limit = self.limit()
            if now - self._counted_at > COUNT_AGE:
                try:
                    self._open = len(os.listdir("/proc/self/fd")) - 1   # less listdir's own
                except OSError:              # EMFILE itself (the listing takes an fd)
                    self._open = limit
                self._counted_at = now
            return limit - self._open >= k

    def taken(self, n: int = 1) -> None:
        """n fds opened (or maybe opened) since the last count: an accept
        let in, a control client ZeroMQ accepted. Counted until the next
        count."""
        with self._lock:
            self._open += n

    def given(self, n: int = 1) -> None:
        """n fds that were taken() closed again (exact whether or not a
        count came in between: a count sees those still open)."""
        with self._lock:
            self._open -= n

    def stale(self) -> None:
        """Something may have opened many fds (a hand-off read: up to
        FD_BATCH): the next check counts anew."""
        with self._lock:
            self._counted_at = -COUNT_AGE

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
