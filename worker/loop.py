"""The worker's event loop: one thread per fdcore thread context.

Each thread: poll (the update pass, epoll_wait with the GIL released, the
enter step, all in one C call) -> for a listener, accept a batch and insert
each connection owned by this thread (FDC_ACCEPTED: no probe syscall) -> for
a connection, its stream handler -> leave the whole batch in one C call.
There is no Python lock on this path: a connection is only touched by the
thread that owns it, and the fd -> connection dict is only changed by single
dict operations.

Listeners are inserted once per thread group (dup'ed numbers, CLONED,
EXCLUSIVE): only one idle thread is woken per new connection.

EMFILE/ENFILE on accept: every thread stops accepting for `emfile_pause`
seconds instead of spinning on a listener it cannot serve, logs once, and
resumes by itself.

A handler may block (a database call). A watchdog thread notices a loop
thread that has been inside one handler for `takeover_after` seconds and
asks an idle thread of the same group to take over (fdcore takeover) the
stuck thread's connections that have work waiting, so one slow request does
not stall the other clients of its thread. The watchdog costs nothing when
nothing happens: it sleeps without a timeout once a whole period passed with
no handler run, and the first loop thread to run a handler after that wakes
it (one eventfd write per quiet-to-busy transition, never per event).
"""
from __future__ import annotations

import errno
import itertools
import logging
import os
import select
import socket
import threading
import time

from sockherd.fdcore import Table
from sockherd.worker.stream import Connection

log = logging.getLogger("sockherd.worker")

KIND_LISTENER = 1
KIND_CONN = 2


class Loop:
    """Runs `table`'s thread contexts over the given listeners with a stream
    handler class. start() spawns the threads; stop() ends them and closes
    every connection and listener.

    With control=True the table's last context is kept out of the loop for
    the caller's own thread (the worker's main thread): drain() then deletes
    the listeners at once from there, even while every loop thread is stuck
    in a slow handler."""

    def __init__(self, table: Table, handler_class, *, accept_batch: int = 64,
                 emfile_pause: float = 0.5, control: bool = False,
                 takeover_after: float = 0.5):
        self.table = table
        self.identity = (0, 0)                      # (generation, index), for the status page
        self.control = table.threads[-1] if control else None
        self.loop_threads = table.threads[:-1] if control else table.threads
        self.handler_class = handler_class
        self.accept_batch = accept_batch
        self.emfile_pause = emfile_pause
        self.conns: dict[int, Connection] = {}
        self.listeners: set[int] = set()           # listener fds, one per group
        self._cookies = itertools.count(1)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept_paused_until = 0.0
        self._emfile_logged = False
        self.rotate_accept = True            # see _requeue
        self._draining = threading.Event()
        self._listeners_deleted = threading.Lock()   # taken once, by the first drainer
        self.drained = threading.Event()             # draining and no connection left
        # ... and the same as an fd, for a main thread that waits in select()
        self.drained_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.idle_grace = 1.0
        self.errors: list[BaseException] = []
        # slow handlers (see the module doc): per loop thread, by position,
        # when its current handler started (0.0: not in a handler) and which
        # stuck sibling it was asked to relieve; written by single stores
        self.takeover_after = takeover_after
        self._pos = {th.tid: i for i, th in enumerate(self.loop_threads)}
        self._busy = [0.0] * len(self.loop_threads)
        self._relieve: list[int | None] = [None] * len(self.loop_threads)
        self._activity = 0                  # handler batches run (a hint, not exact)
        self._watch_asleep = False
        self._watch_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.takeovers = [0] * len(self.loop_threads)   # connections taken, per thread

    # ---- set-up ------------------------------------------------------------------
    def add_listener(self, sock: socket.socket) -> None:
        """Takes over a listening socket: the table owns its fd from now on."""
        sock.setblocking(False)
        masks = {}
        for th in self.loop_threads:
            masks[th.tgid] = masks.get(th.tgid, 0) | th.bit
        fds = self.table.insert_listener(sock.detach(), next(self._cookies), masks,
                                         kind=KIND_LISTENER, exclusive=True)
        for fd in fds.values():
            self.listeners.add(fd)
            self.loop_threads[0].want_recv(fd)      # any context may change any fd

    def start(self) -> None:
        for th in self.loop_threads:
            t = threading.Thread(target=self._run, args=(th,), name=f"sockherd-{th.tid}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        if self.takeover_after > 0 and any(self._siblings(i) for i in range(len(self._busy))):
            t = threading.Thread(target=self._watch, name="sockherd-watchdog", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 10.0) -> None:
        """Ends the threads, then closes every connection and listener."""
        self._stop.set()
        for th in self.loop_threads:
            self.table.wake(th.tid)
        os.eventfd_write(self._watch_fd, 1)
        for t in self._threads:
            t.join(timeout)
            if t.is_alive():
                raise RuntimeError(f"loop thread {t.name} did not stop within {timeout}s")
        for conn in list(self.conns.values()):
            conn._close_now()
        self._delete_listeners(self.loop_threads[0])
        if self.drained_fd >= 0:
            os.close(self.drained_fd)
            os.close(self._watch_fd)
            self.drained_fd = -1

    def forget(self, conn: Connection) -> None:
        # only our own entry: the number may already belong to a new connection
        if self.conns.get(conn.fd) is conn:
            del self.conns[conn.fd]

    # ---- the loop ----------------------------------------------------------------
    def drain(self, idle_grace: float) -> None:
        """Stops accepting (every listener deleted through fdcore, so each is
        DEL'ed from every thread's epoll before its close: seed 004), lets
        connections finish, and closes a connection once it stayed idle for
        idle_grace seconds (a client may be sending on it right now: cutting
        an idle connection at once is the reset nginx and HAProxy users see
        on reload). `drained` is set once none remains. The thread that owns
        the control context if there is one (it deletes the listeners with
        it), else any thread."""
        self.idle_grace = idle_grace
        if self.control is not None and self._listeners_deleted.acquire(blocking=False):
            self._delete_listeners(self.control)
        self._draining.set()
        for th in self.loop_threads:
            self.table.wake(th.tid)

    def _delete_listeners(self, th) -> None:
        for fd in list(self.listeners):
            th.delete(fd)                   # any thread may delete any fd; deferred
        self.listeners.clear()              # to a thread still inside it (accept)

    def _drain_step(self, th) -> int:
        """A draining thread's turn: delete the listeners (the first thread to
        get here), close its own connections idle for the grace, and return
        the poll timeout until its next idle deadline (-1: none left)."""
        if self._listeners_deleted.acquire(blocking=False):
            self._delete_listeners(th)
        now = time.monotonic()
        mine = [c for c in list(self.conns.values()) if c.th is th]
        next_due = None
        for conn in mine:
            due = conn.last_active + self.idle_grace
            if due <= now and not conn.pending:
                conn.close()
            else:
                next_due = due if next_due is None else min(next_due, due)
        if not self.conns and not self.drained.is_set():
            self.drained.set()
            os.eventfd_write(self.drained_fd, 1)
        if next_due is None:
            return -1
        return max(1, int((next_due - now) * 1000) + 1)

    def _run(self, th) -> None:
        me = self._pos[th.tid]
        busy = self._busy
        clock = time.monotonic
        try:
            while not self._stop.is_set():
                timeout = self._resume_accepting(th)
                if self._draining.is_set():
                    timeout = self._drain_step(th)
                events = th.poll(timeout)
                if events:
                    self._activity += 1
                    busy[me] = clock()
                    if self._watch_asleep:          # read after our store (the
                        self._wake_watchdog()       # watchdog: the other way round)
                for ev in events:
                    busy[me] = clock()
                    if ev.kind == KIND_LISTENER:
                        self._accept(th, ev.fd)
                        continue
                    conn = self.conns.get(ev.fd)
                    # conn.th: a sibling may have taken it over while we were
                    # stuck before this event (the core then refuses our enter,
                    # except for an fd we held: that one is still ours)
                    if conn is not None and conn.cookie == ev.owner and conn.th is th:
                        conn.on_events(ev.events)
                busy[me] = 0.0
                th.leave_all()
                if self._relieve[me] is not None:
                    self._take_from(th, me)
        except BaseException as exc:  # reported to whoever runs the loop
            self.errors.append(exc)
            log.exception("loop thread %d failed", th.tid)

    # ---- slow handlers -------------------------------------------------------------
    def _siblings(self, i: int) -> list[int]:
        tgid = self.loop_threads[i].tgid
        return [j for j, th in enumerate(self.loop_threads) if th.tgid == tgid and j != i]

    def _wake_watchdog(self) -> None:
        self._watch_asleep = False
        os.eventfd_write(self._watch_fd, 1)

    def _watch(self) -> None:
        """The watchdog thread: wakes at the moment a running handler reaches
        takeover_after (then every half period while it stays stuck) and asks
        an idle sibling to relieve its thread; sleeps with no timeout once a
        period went by with no handler run."""
        period = self.takeover_after
        seen = -1
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                due = None
                for i, since in enumerate(self._busy):
                    if not since:
                        continue
                    if now - since >= period:
                        self._ask_relief(i, now - since)
                        at = now + period / 2
                    else:
                        at = since + period
                    due = at if due is None else min(due, at)
                if due is not None:
                    timeout = max(0.0, due - now)
                elif self._activity != seen:
                    seen = self._activity
                    timeout = period
                else:
                    # Dekker with _run: our flag store, then a re-read of the
                    # handlers' state; a loop thread stores its busy stamp,
                    # then reads the flag: one of us sees the other
                    self._watch_asleep = True
                    if self._activity != seen or any(self._busy):
                        self._watch_asleep = False
                        continue
                    timeout = None
                select.select([self._watch_fd], [], [], timeout)
                try:
                    os.eventfd_read(self._watch_fd)
                except BlockingIOError:
                    pass
        except BaseException as exc:
            self.errors.append(exc)
            log.exception("watchdog failed")

    def _ask_relief(self, stuck: int, for_s: float) -> None:
        for j in self._siblings(stuck):
            if not self._busy[j] and self._relieve[j] is None:
                self._relieve[j] = stuck
                self.table.wake(self.loop_threads[j].tid)
                return
        log.debug("thread %d in one handler for %.1fs; no idle sibling to relieve it",
                  self.loop_threads[stuck].tid, for_s)

    def _take_from(self, th, me: int) -> None:
        """th (position me) takes over the connections of its stuck sibling
        that have work waiting: readable, or output the kernel will take.
        Connections the sibling holds right now (its current batch) are
        refused by the core (EBUSY) and stay with it."""
        stuck, self._relieve[me] = self._relieve[me], None
        victim = self.loop_threads[stuck]
        since = self._busy[stuck]
        if not since or time.monotonic() - since < self.takeover_after:
            return                                   # it came back meanwhile
        theirs = {c.fd: c for c in list(self.conns.values()) if c.th is victim}
        if not theirs:
            return
        probe = select.poll()
        for fd, conn in theirs.items():
            probe.register(fd, select.POLLIN | (select.POLLOUT if conn.pending else 0))
        moved = 0
        for fd, _ in probe.poll(0):
            conn = theirs[fd]
            if conn.th is not victim or conn.closed or not th.takeover(fd, conn.cookie):
                continue
            conn.th = th                   # ours from here: the core re-polls it
            conn._want_send = False        # for th (recv is stopped by the takeover)
            conn._sync()
            moved += 1
        if moved:
            self.takeovers[me] += moved
            log.info("thread %d took %d connection(s) from thread %d, inside one handler "
                     "for %.1fs", th.tid, moved, victim.tid, time.monotonic() - since)

    def _accept(self, th, lfd: int) -> None:
        if time.monotonic() < self._accept_paused_until:
            return
        try:
            fds = th.accept(lfd, self.accept_batch)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self._pause_accepting(th, exc)
                return
            raise
        if fds and self.rotate_accept:
            self._requeue(th, lfd)
        for fd in fds:
            cookie = next(self._cookies)
            try:
                socket_opt_nodelay(fd)
                self.table.insert(fd, cookie, tgid=th.tgid, thread_mask=th.bit, kind=KIND_CONN,
                                  accepted=True)
            except OSError:
                log.exception("cannot take connection fd %d", fd)
                os.close(fd)
                continue
            conn = Connection(self, th, fd, cookie, self.handler_class())
            self.conns[fd] = conn
            conn._call("on_connect")
            if not conn.closed:
                conn._sync()

    def _requeue(self, th, lfd: int) -> None:
        """Moves th's own registration of the listener to the end of the
        listener's wait queue (fdcore requeue: DEL + ADD on th's epoll
        only), so the next connection wakes the idle poller that waited
        longest. Why: the kernel hands an EPOLLEXCLUSIVE listener's
        connection to the FIRST registered epoll that has an idle waiter, so
        under a light load one thread of one worker took every connection
        (measured: 200 of 200 kept-alive connections on one of 2 workers)
        while the others idled; with the GIL that is one core serving
        everything. Two epoll_ctl per accept batch buy round-robin over
        every thread of every worker."""
        try:
            th.requeue(lfd)
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EBADF):   # not held / deleted: skip
                raise

    def _pause_accepting(self, th, exc: OSError) -> None:
        self._accept_paused_until = time.monotonic() + self.emfile_pause
        if not self._emfile_logged:
            self._emfile_logged = True
            log.warning("%s; not accepting for %.1fs (logged once)", exc.strerror,
                        self.emfile_pause)
        # th's own context: a verb may touch the caller's local update list,
        # so never another running thread's (any fd of any group is fine);
        # a copy, since a drain may empty the set meanwhile
        for fd in list(self.listeners):
            th.stop_recv(fd)

    def _resume_accepting(self, th) -> int:
        """Poll timeout: -1, or until accepting resumes (any thread resumes it)."""
        until = self._accept_paused_until
        if not until:
            return -1
        left = until - time.monotonic()
        if left > 0:
            return max(1, int(left * 1000))
        self._accept_paused_until = 0.0
        for fd in list(self.listeners):
            th.want_recv(fd)
        return -1


def socket_opt_nodelay(fd: int) -> None:
    s = socket.socket(fileno=fd)
    try:
        if s.family in (socket.AF_INET, socket.AF_INET6):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        s.detach()
