"""Python face of the native fd table: a Table and one Thread context per poller.

A Thread context belongs to one OS thread at a time (its local update list and
epoll instance are not shared). Tests may drive several contexts from one OS
thread, one step at a time, to build exact interleavings; the hooks
(`Table.set_hook`) let them run another context's step at a named point inside
a protocol.

Every C call releases the GIL (cffi API mode); there is no Python lock on the
poll path.
"""
from __future__ import annotations

import enum
import errno
import os
import resource
import struct
from dataclasses import dataclass
from typing import Callable, NamedTuple

from sockherd.fdcore._fdcore import ffi, lib


class Outcome(enum.IntEnum):
    DONE = lib.FDC_DONE
    CLOSED = lib.FDC_CLOSED
    MIGRATED = lib.FDC_MIGRATED


class Hook(enum.IntEnum):
    ENTER_RUNNING = lib.FDC_HK_ENTER_RUNNING
    ENTER_RETRY = lib.FDC_HK_ENTER_RETRY
    LEAVE = lib.FDC_HK_LEAVE
    TAKEOVER_OWNED = lib.FDC_HK_TAKEOVER_OWNED
    DELETE_ORPHANED = lib.FDC_HK_DELETE_ORPHANED
    UPDATE_CONSUMED = lib.FDC_HK_UPDATE_CONSUMED
    CLOSE_BEGIN = lib.FDC_HK_CLOSE_BEGIN
    CLOSE_DRAINED = lib.FDC_HK_CLOSE_DRAINED
    CLOSE_END = lib.FDC_HK_CLOSE_END
    BEFORE_WAIT = lib.FDC_HK_BEFORE_WAIT
    RELEASE_CLEARED = lib.FDC_HK_RELEASE_CLEARED
    WALK_ARRIVE = lib.FDC_HK_WALK_ARRIVE
    LIST_UNLINK = lib.FDC_HK_LIST_UNLINK
    ENTER_OWNER = lib.FDC_HK_ENTER_OWNER


class State(enum.IntFlag):
    ACTIVE_R = lib.FDC_ACTIVE_R
    READY_R = lib.FDC_READY_R
    SHUT_R = lib.FDC_SHUT_R
    ACTIVE_W = lib.FDC_ACTIVE_W
    READY_W = lib.FDC_READY_W
    SHUT_W = lib.FDC_SHUT_W
    ERR = lib.FDC_ERR
    WATCH_HUP = lib.FDC_WATCH_HUP
    POLL_IN = lib.FDC_POLL_IN
    POLL_PRI = lib.FDC_POLL_PRI
    POLL_OUT = lib.FDC_POLL_OUT
    POLL_ERR = lib.FDC_POLL_ERR
    POLL_HUP = lib.FDC_POLL_HUP
    POLL_RDHUP = lib.FDC_POLL_RDHUP
    POLL_CTL = lib.FDC_POLL_CTL
    LINGER_RISK = lib.FDC_LINGER_RISK
    CLONED = lib.FDC_CLONED
    EXCLUSIVE = lib.FDC_EXCLUSIVE
    DISOWN = lib.FDC_DISOWN
    MUST_CLOSE = lib.FDC_MUST_CLOSE
    EDGE = lib.FDC_EDGE
    KEPT_R = lib.FDC_KEPT_R          # EDGE: an unwanted edge kept for the next want
    KEPT_W = lib.FDC_KEPT_W


class Event(NamedTuple):
    """One report the polling thread now holds (leave(fd, gen) releases it).
    events holds State.POLL_* bits as a plain int: building an IntFlag per
    event was most of the poll path's cost (bench/RESULTS.md). It may name a
    direction nobody wants any more: handlers check what they asked for."""

    fd: int
    events: int
    gen: int
    kind: int
    owner: int


@dataclass(frozen=True)
class FdInfo:
    """One line of `show fd`: a snapshot, not a transaction."""

    fd: int
    tgid: int
    refcount: int
    state: State
    generation: int
    nb_takeover: int
    kind: int
    in_shared_list: bool
    running_mask: int
    thread_mask: int
    update_mask: int
    polled_recv: int
    polled_send: int
    polled_hup: int      # polled_recv bits that are a hang-up watch alone (no EPOLLIN)
    owner: int
    ctl_errno: int


COUNTERS = (
    "loops", "poll_io", "poll_drop_fd", "poll_skip_fd", "poll_stale", "fd_takeover",
    "accepted", "accept_empty", "wake_nowork", "wakeups",
    "ctl_add", "ctl_mod", "ctl_del", "ctl_err",
)


# struct fdc_event as laid out by the C compiler: int32, 3 x uint32, uint64
_EVENT = struct.Struct("=iIIIQ")
_OUTCOMES = tuple(Outcome(i) for i in range(len(Outcome)))


# what a native caller may use (Table.c_api)
C_API = ("fdc_poll", "fdc_enter", "fdc_leave", "fdc_leave_batch", "fdc_delete", "fdc_want_recv",
         "fdc_stop_recv", "fdc_want_send", "fdc_stop_send", "fdc_cant_recv", "fdc_insert",
         "fdc_accept", "fdc_counters", "fdc_insert_shared", "fdc_wake", "fdc_dump")


def check(rc: int, what: str) -> int:
    """The one place a negative errno from the core becomes an OSError."""
    if rc < 0:
        raise OSError(-rc, f"{what}: {os.strerror(-rc)}")
    return rc


def default_maxfd() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(1024, min(soft, 1 << 20))


@ffi.def_extern()
def _fdc_py_hook(arg, point, tid, fd, gen):  # noqa: ANN001 - cffi callback
    table = ffi.from_handle(arg)
    fn = table._hook
    if fn is None:
        return
    try:
        fn(Hook(point), tid, fd, gen)
    except BaseException as exc:  # a C caller cannot take an exception
        table.hook_errors.append(exc)


class Table:
    """The fd table of one process: `threads` contexts split over `groups`."""

    def __init__(self, threads: int = 1, groups: int = 1, maxfd: int | None = None):
        err = ffi.new("int *")
        self.maxfd = maxfd if maxfd is not None else default_maxfd()
        ptr = lib.fdc_table_new(self.maxfd, threads, groups, err)
        if ptr == ffi.NULL:
            check(err[0], f"fd table ({threads} threads, {groups} groups, maxfd {self.maxfd})")
        self._t = ptr
        self._hook: Callable[[Hook, int, int, int], None] | None = None
        self._handle = ffi.new_handle(self)
        self.hook_errors: list[BaseException] = []
        self.nbgroup = groups
        self.threads = [Thread(self, tid) for tid in range(threads)]

    # lifecycle ------------------------------------------------------------
    def close(self) -> None:
        """Frees the table and the pollers; fds still inserted stay open."""
        if self._t is not None:
            lib.fdc_set_hook(self._t, ffi.NULL, ffi.NULL)
            lib.fdc_table_free(self._t)
            self._t = None

    def __enter__(self) -> "Table":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def ptr(self):
        if self._t is None:
            raise ValueError("fd table is closed")
        return self._t

    # fds -------------------------------------------------------------------
    def insert(self, fd: int, owner: int, *, tgid: int = 1, thread_mask: int = 1, kind: int = 0,
               cloned: bool = False, exclusive: bool = False, linger_risk: bool = False,
               disown: bool = False, sole: bool = False, accepted: bool = False) -> None:
        """Registers fd, which the table now owns: it closes it at delete.

        A listening socket is always made CLONED (it is open in the master
        too: seed 004) unless sole=True states nobody else holds it;
        accepted=True skips these checks (and their syscall) for an fd that
        accept() just returned. With disown=True the table never closes fd:
        the caller keeps it, and may close it only once delete() returned
        True or released() says so.
        Raises OSError: EBADF (not open), EPERM (a file epoll cannot poll),
        EINVAL (bad mask or flags), EEXIST (already in the table)."""
        flags = ((lib.FDC_CLONED if cloned else 0) | (lib.FDC_EXCLUSIVE if exclusive else 0)
                 | (lib.FDC_LINGER_RISK if linger_risk else 0) | (lib.FDC_DISOWN if disown else 0)
                 | (lib.FDC_SOLE if sole else 0) | (lib.FDC_ACCEPTED if accepted else 0))
        rc = lib.fdc_insert(self.ptr, fd, owner, kind, tgid, thread_mask, flags)
        if rc == -errno.EPERM:
            raise OSError(errno.EPERM, f"insert fd {fd}: epoll cannot poll it (a regular "
                                       "file, a directory, a device without poll, an O_PATH "
                                       "fd, or an epoll fd asked exclusive)")
        check(rc, f"insert fd {fd}")

    def c_api(self) -> dict[str, int]:
        """The addresses of fdcore's C functions (C_API) and of this table,
        for a C extension that drives this same implementation without
        cffi (worker/native/conn/conn.h, struct fdc_api). The table must outlive
        their use."""
        api = {name: int(ffi.cast("uintptr_t", ffi.addressof(lib, name))) for name in C_API}
        api["table"] = int(ffi.cast("uintptr_t", self.ptr))
        return api

    def released(self, fd: int, gen: int) -> bool:
        """Whether incarnation gen of fd is over (closed, or for a disowned fd
        forgotten and removed from every poller): a disowned fd's owner may
        close it from then on. gen is dump(fd).generation before the delete."""
        return bool(check(lib.fdc_released(self.ptr, fd, gen), f"released fd {fd}"))

    def insert_listener(self, fd: int, owner: int, masks: dict[int, int], *, kind: int = 0,
                        exclusive: bool = False) -> dict[int, int]:
        """Inserts a listening socket for the threads of several groups: one fd
        number per group (dup'ed), all CLONED. Returns {tgid: fd}."""
        tgids = 0
        for tgid in masks:
            tgids |= 1 << tgid
        out = ffi.new("int[]", lib.FDC_MAX_GROUPS + 1)
        check(lib.fdc_listener_fds(self.ptr, fd, tgids, out), f"listener fds for fd {fd}")
        fds = {tgid: out[tgid] for tgid in masks}
        done: list[int] = []
        try:
            for tgid, mask in masks.items():
                self.insert(fds[tgid], owner, tgid=tgid, thread_mask=mask, kind=kind,
                            cloned=True, exclusive=exclusive)
                done.append(tgid)
        except OSError:
            for tgid, gfd in fds.items():
                if tgid in done:
                    self.threads[self.group_base(tgid)].delete(gfd)
                elif gfd != fd:
                    os.close(gfd)
            raise
        return fds

    def group_base(self, tgid: int) -> int:
        """tid of the first thread of group tgid."""
        for th in self.threads:
            if th.tgid == tgid:
                return th.tid
        raise ValueError(f"no thread group {tgid}")

    def dump(self, fd: int) -> FdInfo:
        info = ffi.new("struct fdc_fdinfo *")
        check(lib.fdc_dump(self.ptr, fd, info), f"dump fd {fd}")
        return FdInfo(
            fd=info.fd, tgid=info.tgid, refcount=info.refcount, state=State(info.state),
            generation=info.generation, nb_takeover=info.nb_takeover, kind=info.kind,
            in_shared_list=bool(info.in_shared_list), running_mask=info.running_mask,
            thread_mask=info.thread_mask, update_mask=info.update_mask,
            polled_recv=info.polled_recv, polled_send=info.polled_send,
            polled_hup=info.polled_hup, owner=info.owner,
            ctl_errno=info.ctl_errno,
        )

    def show_fd(self) -> list[FdInfo]:
        """Every fd currently in the table (the numbers open in this process
        are the candidates, so this stays cheap with a large maxfd)."""
        out = []
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd < self.maxfd:
                info = self.dump(fd)
                if info.tgid:
                    out.append(info)
        return sorted(out, key=lambda i: i.fd)

    def wake(self, tid: int) -> None:
        check(lib.fdc_wake(self.ptr, tid), f"wake thread {tid}")

    def set_hook(self, fn: Callable[[Hook, int, int, int], None] | None) -> None:
        """fn(point, tid, fd, gen) runs at each hook point, in the thread
        that reaches it; None removes it. Exceptions land in hook_errors."""
        self._hook = fn
        if fn is None:
            lib.fdc_set_hook(self.ptr, ffi.NULL, ffi.NULL)
        else:
            lib.fdc_set_hook(self.ptr, lib._fdc_py_hook, self._handle)


class Thread:
    """One poller thread's context: its epoll instance, local update list and
    counters. Use it from one OS thread at a time."""

    def __init__(self, table: Table, tid: int):
        self.table = table
        self.tid = tid
        self._th = lib.fdc_thread(table.ptr, tid)
        ident = ffi.new("int[3]")
        lib.fdc_thread_info(self._th, ident, ident + 1, ident + 2)
        self.tgid, self.ltid, self.epfd = ident[0], ident[1], ident[2]
        self.bit = 1 << self.ltid
        self.address = int(ffi.cast("uintptr_t", self._th))   # for native callers (c_api)
        self._events = ffi.new("struct fdc_event[]", lib.FDC_EVBATCH)
        assert ffi.sizeof("struct fdc_event") == _EVENT.size
        self._held = 0   # size of the last batch, for leave_all()
        self._gen = ffi.new("uint32_t *")
        self._accepted = ffi.new("int[]", lib.FDC_EVBATCH)

    # the running protocol ---------------------------------------------------
    def enter(self, fd: int) -> tuple[Outcome, int]:
        """Takes a running bit on fd (step function; poll() does it itself)."""
        r = lib.fdc_enter(self._th, fd, self._gen)
        return _OUTCOMES[r], self._gen[0]

    def leave(self, fd: int, gen: int) -> Outcome:
        return _OUTCOMES[lib.fdc_leave(self._th, fd, gen)]

    def leave_all(self) -> int:
        """Leaves every event of the last poll() batch in one C call (those
        already left one by one are skipped). Returns how many were CLOSED:
        closed by this call, or no longer held (left or closed already)."""
        n, self._held = self._held, 0
        return lib.fdc_leave_batch(self._th, self._events, n)

    def delete(self, fd: int) -> bool:
        """Deletes and closes fd; False if the close is left to the last
        thread still inside it."""
        return bool(check(lib.fdc_delete(self._th, fd), f"delete fd {fd}"))

    def takeover(self, fd: int, expected_owner: int) -> bool:
        """Takes fd for this thread alone; False if it is in use or is no
        longer the expected incarnation (normal outcomes of a race). Raises
        OSError for misuse: EBADF (fd out of range), EINVAL (this thread is
        one owner among several of a shared fd, or fd is a group-shared
        connection: insert_shared)."""
        rc = lib.fdc_takeover(self._th, fd, expected_owner)
        if rc in (-errno.EBUSY, -errno.ESTALE):
            return False
        check(rc, f"takeover fd {fd}")
        return True

    # direction verbs ----------------------------------------------------------
    def want_recv(self, fd: int) -> None:
        check(lib.fdc_want_recv(self._th, fd), f"want_recv fd {fd}")

    def stop_recv(self, fd: int) -> None:
        check(lib.fdc_stop_recv(self._th, fd), f"stop_recv fd {fd}")

    def want_send(self, fd: int) -> None:
        check(lib.fdc_want_send(self._th, fd), f"want_send fd {fd}")

    def stop_send(self, fd: int) -> None:
        check(lib.fdc_stop_send(self._th, fd), f"stop_send fd {fd}")

    def want_hup(self, fd: int) -> None:
        """While recv is stopped, hang-ups and errors are still reported
        (fd-t.h WATCH_HUP): a paused connection learns its peer left."""
        check(lib.fdc_want_hup(self._th, fd), f"want_hup fd {fd}")

    def stop_hup(self, fd: int) -> None:
        check(lib.fdc_stop_hup(self._th, fd), f"stop_hup fd {fd}")

    def may_recv(self, fd: int) -> None:
        check(lib.fdc_may_recv(self._th, fd), f"may_recv fd {fd}")

    def cant_recv(self, fd: int) -> None:
        check(lib.fdc_cant_recv(self._th, fd), f"cant_recv fd {fd}")

    def may_send(self, fd: int) -> None:
        check(lib.fdc_may_send(self._th, fd), f"may_send fd {fd}")

    def cant_send(self, fd: int) -> None:
        check(lib.fdc_cant_send(self._th, fd), f"cant_send fd {fd}")

    # the poller ---------------------------------------------------------------
    def update_pass(self) -> int:
        """Applies pending updates to this thread's epoll; returns syscalls."""
        return lib.fdc_update_pass(self._th)

    def poll(self, timeout_ms: int = -1, max_events: int = lib.FDC_EVBATCH) -> list[Event]:
        """One loop turn. The GIL is released in epoll_wait. The thread holds
        each returned fd until it calls leave(fd, gen)."""
        n = lib.fdc_poll(self._th, timeout_ms, self._events, max_events)
        self._held = max(n, 0)
        if n <= 0:
            check(n, "poll")
            return []
        # one C-level unpack of the whole batch: per-field cffi reads and an
        # IntFlag per event cost more than the poll itself
        return list(map(Event._make, _EVENT.iter_unpack(ffi.buffer(self._events, n * _EVENT.size))))

    def accept(self, lfd: int, max_conns: int = 64) -> list[int]:
        """Accepts a batch of connections (non-blocking, CLOEXEC fds)."""
        max_conns = min(max_conns, lib.FDC_EVBATCH)
        n = check(lib.fdc_accept(self._th, lfd, self._accepted, max_conns), f"accept on fd {lfd}")
        return ffi.unpack(self._accepted, n)

    def insert_shared(self, fd: int, owner: int, thread_mask: int, *, kind: int = 0) -> None:
        """A connection this thread accepted, shared by the threads of
        thread_mask (this thread's group, its own bit included): reading,
        registered edge-triggered and exclusive in each of their pollers,
        this thread's first (fd.h, fdc_insert_shared).
        Raises OSError as insert() does (EINVAL: own bit not in the mask)."""
        check(lib.fdc_insert_shared(self._th, fd, owner, kind, thread_mask),
              f"insert shared fd {fd}")

    def requeue(self, fd: int) -> bool:
        """Moves this thread's registration of an exclusive fd it holds to
        the end of the file's wait queue (round-robin accepts). False if
        there is nothing to move (not polled for recv as exclusive here).
        Raises OSError: EPERM if this thread does not hold fd (or fd is
        another group's), or the errno of a failed re-registration (then
        also reported by the next poll)."""
        rc = lib.fdc_requeue(self._th, fd)
        if rc == 1:
            return False
        check(rc, f"requeue fd {fd}")
        return True

    def counters(self) -> dict[str, int]:
        c = ffi.new("struct fdc_counters *")
        lib.fdc_counters(self._th, c)
        return {name: getattr(c, name) for name in COUNTERS}
