"""The worker's event loop: one thread per fdcore thread context.

Each thread: poll (the update pass, epoll_wait with the GIL released, the
enter step, all in one C call) -> for a listener, accept a batch and insert
each connection owned by this thread (FDC_ACCEPTED: no probe syscall) -> for
a connection, its stream handler -> leave the whole batch in one C call.
There is no Python lock on this path: a connection is only touched by the
thread that owns it, and the fd -> connection dict is only changed by single
dict operations.

Listeners are inserted once per thread group (dup'ed numbers, CLONED,
EXCLUSIVE): only one idle thread is woken per new connection, and the thread
that accepted moves its registration to the end of the wait queue
(fdc_requeue), so connections go round-robin over the idle pollers.

Whether the listeners are polled at all is worker/gate.py's: not during an
EMFILE/ENFILE pause (every thread stops accepting for `emfile_pause`
seconds instead of spinning, logs once, resumes by itself), not past
max_connections, and not while this worker is ahead of the others in open
connections (the balance, worker/board.py).

Connection timers (header and keep-alive timeouts) are a heap per loop
thread, fired under the running bit like any event.

A handler may block (a database call): worker/relief.py moves the
connections with work waiting off a thread stuck in one handler. For that,
a thread with siblings in its group leaves its batch at once and enters each
fd again just before its handler; a thread alone in its group holds the
batch (one C call to leave it all).

Connection verbs always use the calling loop thread's context (`local.th`);
a thread that is not a loop thread posts the call to the owner's mailbox.
"""
from __future__ import annotations

import collections
import email.utils
import errno
import heapq
import itertools
import logging
import os
import select
import socket
import threading
import time

from sockherd.fdcore import Outcome, Table
from sockherd.worker.gate import CAP, EMFILE, Gate
from sockherd.worker.relief import Relief
from sockherd.worker.stream import (OUTPUT_LIMIT, Connection, read_unread, ready_now,
                                     water_marks)

log = logging.getLogger("sockherd.worker")

KIND_LISTENER = 1
KIND_CONN = 2
KIND_AIO = 3          # an fd an ASGI app registered with its asyncio loop (worker/aio.py)


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
                 takeover_after: float = 0.5, max_connections: int = 0,
                 output_limit: int = OUTPUT_LIMIT, proxy=None, header_timeout: float = 15.0):
        self.table = table
        self.identity = (0, 0)                      # (generation, index), for the status page
        self.control = table.threads[-1] if control else None
        self.loop_threads = table.threads[:-1] if control else table.threads
        self.handler_class = handler_class
        self.accept_batch = accept_batch
        self.emfile_pause = emfile_pause
        self.conns: dict[int, Connection] = {}
        self.listeners: set[int] = set()           # listener fds, one per group
        # with the engine's TLS on (set_tls): the listener fds that serve
        # plain beside the TLS ones (master/tls_binds.py), and the
        # connections accepted from the TLS ones outside fdcore's accept (a
        # drain's queue, _empty_queued) until they are taken or refused
        self.plain_listeners: set[int] = set()
        self._tls_accepted: set[int] = set()
        self._cookies = itertools.count(1)
        self._stop = threading.Event()
        # _stop's and _draining's state as plain bools, set with them: what
        # every turn reads (a Python call to Event.is_set per read cost
        # ~3 % of a WSGI hello request's instructions, http_callgrind)
        self._stopping = False
        self._draining_now = False
        self._threads: list[threading.Thread] = []
        self._accept_paused_until = 0.0
        self.gate = Gate(self)               # listeners polled or not (worker/gate.py)
        self._emfile_logged = False
        self.rotate_accept = True            # see _requeue
        # past max_connections open connections (0: no cap) the listeners
        # are not polled until one closes: the backlog waits, nothing is refused
        self.max_connections = max_connections
        # a stream connection's pending output past this closes it (stream.py)
        self.output_limit = output_limit
        self.high_water, self.low_water = water_marks(output_limit)
        # the PROXY protocol header a stream connection waits for (a
        # worker/proxy.Policy, or None), within header_timeout
        self.proxy = proxy
        self.header_timeout = header_timeout
        self.queue_lock = threading.Lock()      # Connection._queued (_post_write)
        # stream handlers that take part in drains (on_drain): told by _drain_step
        self._tells_drain = callable(getattr(handler_class, "on_drain", None))
        # accept pauses, for the metrics (worker/report.py): EMFILE/ENFILE and
        # the like, and max_connections reached (plain ints, bumped by the
        # loop threads: a rare lost increment is fine for a statistic)
        self.paused_emfile = 0
        self.paused_cap = 0
        self._draining = threading.Event()
        self._listeners_deleted = threading.Lock()   # taken once, by the first drainer
        self.drained = threading.Event()             # draining and no connection left
        # ... and the same as an fd, for a main thread that waits in select()
        self.drained_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.idle_grace = 1.0
        self.errors: list[BaseException] = []
        # loop threads that ended (positions), by a bug of ours or a kill:
        # what the app raises never ends one (worker/native/wsgi_app.c). The
        # worker's main thread watches failed_fd: it drains and exits, so
        # the master replaces the worker (bootstrap.py); `errors` says why
        self.ended: set[int] = set()
        self.failed_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.local = threading.local()          # .th: this loop thread's context
        self._pos = {th.tid: i for i, th in enumerate(self.loop_threads)}
        self._mail = [collections.deque() for _ in self.loop_threads]
        # connection timers, a heap per loop thread of (when, seq, conn):
        # at most about two entries per connection (Connection.set_timer)
        self._timers: list[list] = [[] for _ in self.loop_threads]
        self._timer_seq = itertools.count()
        self.relief = Relief(self, takeover_after)
        self._stragglers: list[tuple[int, int, int]] = []   # (dup, fd, gen): _delete_listeners
        # accepted by _take_queued, not adopted yet: fd -> when (monotonic)
        self._posted: dict[int, float] = {}
        self._posted_lock = threading.Lock()   # who takes a posted fd: its adopter or
                                               # refuse_posted at the deadline, never both
        self._adopting = 0                  # posted fds claimed, not in conns yet
        # the wsgi interface's native engine (worker/native/engine.c): it
        # runs the connections' side of each turn; None for a stream handler
        make_engine = getattr(handler_class, "make_engine", None)
        self.engine = make_engine(self) if make_engine is not None else None
        self._tls = self.engine is not None and self.engine.tls_counts()["on"]
        # an ASGI app: each loop thread runs an asyncio loop on its poller
        # (worker/aio.py), its tasks the requests that thread serves
        self.asgi = self.engine is not None and self.engine.interface == "asgi"
        self._aio: list = [None] * len(self.loop_threads)
        self._aio_started = [threading.Event() for _ in self.loop_threads]

    # ---- set-up ------------------------------------------------------------------
    def add_listener(self, sock: socket.socket, *, tls: bool = True) -> None:
        """Takes over a listening socket: the table owns its fd from now on.
        tls False: its connections are plain even if the engine speaks TLS
        (set_tls); with tls True they speak it if the engine does."""
        sock.setblocking(False)
        masks = {}
        for th in self.loop_threads:
            masks[th.tgid] = masks.get(th.tgid, 0) | th.bit
        fds = self.table.insert_listener(sock.detach(), next(self._cookies), masks,
                                         kind=KIND_LISTENER, exclusive=True)
        for fd in fds.values():
            self.listeners.add(fd)
            if not tls:
                self.plain_listeners.add(fd)
            self.loop_threads[0].want_recv(fd)      # any context may change any fd

    def start(self) -> None:
        for th in self.loop_threads:
            t = threading.Thread(target=self._run, args=(th,), name=f"sockherd-{th.tid}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        watchdog = self.relief.start()
        if watchdog is not None:
            self._threads.append(watchdog)
        if self.asgi:
            # aio_loop(i) is a running loop from here on (the lifespan's
            # startup runs on loop 0); a thread that ended first is _ended's
            deadline = time.monotonic() + 10.0
            for i, started in enumerate(self._aio_started):
                while not started.wait(0.05) and i not in self.ended:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"loop thread {i}: its asyncio loop did not start")

    def _not_from_a_loop_thread(self, what: str) -> None:
        """stop() and drain() are the worker's main thread's: from a loop
        thread (an app reaches the loop through environ["sockherd.loop"])
        stop() ended every loop thread with no error, the worker silent."""
        if getattr(self.local, "th", None) is not None:
            raise RuntimeError(f"Loop.{what}() from a loop thread: the worker's main thread's")

    def stop(self, timeout: float = 10.0) -> None:
        """Ends the threads, then closes every connection and listener."""
        self._not_from_a_loop_thread("stop")
        self._stopping = True
        self._stop.set()
        if self.drained_fd < 0:
            return                              # stopped already
        for th in self.loop_threads:
            self.table.wake(th.tid)
        self.relief.stop()
        for t in self._threads:
            t.join(timeout)
            if t.is_alive():
                raise RuntimeError(f"loop thread {t.name} did not stop within {timeout}s")
        # every loop thread is gone: this thread may use any context now
        self.local.th = self.loop_threads[0]
        if self.engine is not None:
            self.engine.bind(0)
        try:
            for conn in list(self.conns.values()):
                conn._close_now()
            self._delete_listeners(self.loop_threads[0])
        finally:
            del self.local.th
            if self.engine is not None:
                self.engine.bind(-1)
            if self.asgi:
                from sockherd.worker import aio
                for loop in self._aio:
                    aio.close(loop)          # its tasks' connections closed above
        while self._stragglers:
            os.close(self._stragglers.pop()[0])
        os.close(self.drained_fd)
        self.drained_fd = -1
        os.close(self.failed_fd)
        self.relief.close()

    def post(self, conn: Connection, fn, *args) -> None:
        """Runs fn(*args) on the loop thread that owns conn (for a thread
        that is not a loop thread: fdcore verbs need a context)."""
        owner = conn.th
        self._mail[self._pos[owner.tid]].append((fn, args))
        self.table.wake(owner.tid)

    @property
    def websockets_open(self) -> int | None:
        """Open ASGI WebSockets (asgi_ws.c); None for an interface without them."""
        if self.engine is None or not self.asgi:
            return None
        from sockherd.worker._http import ws_open
        return ws_open()

    def going_away(self) -> None:
        """The drain's deadline (issue 23): every open WebSocket is closed
        with 1001 (going away) by its own loop thread (asgi_ws.c
        ws_going_away), which its app learns as websocket.disconnect 1001;
        the connections close once their close frame went out. The
        worker's main thread's."""
        self._not_from_a_loop_thread("going_away")
        if self.engine is None or not self.asgi:
            return
        from sockherd.worker._http import ws_going_away
        for me, th in enumerate(self.loop_threads):
            self._mail[me].append((ws_going_away, (self.engine,)))
            self.table.wake(th.tid)

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def forget(self, conn: Connection) -> None:
        # only our own entry: the number may already belong to a new connection
        if self.conns.get(conn.fd) is conn:
            del self.conns[conn.fd]
        self._regate()

    def _regate(self) -> None:
        """After a close: this worker's count on the board, and polling on
        again if the cap or the balance no longer hold. The gate's verbs
        need a loop thread's context (or stop()'s): a connection may end on
        a thread of the app's own (a write() from its producer thread to a
        client that reset), which has none; an AttributeError there left
        the cap shut for good, and a worker at max_connections never
        accepted again (review): a live loop thread does it then."""
        gate = self.gate
        gate.publish()
        if not gate.reasons:
            return
        th = getattr(self.local, "th", None)
        if th is None:
            me = next((i for i in range(len(self.loop_threads)) if i not in self.ended), 0)
            self._mail[me].append((self._regate, ()))
            self.table.wake(self.loop_threads[me].tid)
            return
        if CAP in gate.reasons and len(self.conns) < self.max_connections:
            gate.on(th, CAP)
        gate.maybe_balance_on(th)

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
        self._not_from_a_loop_thread("drain")
        self.idle_grace = idle_grace
        if self.engine is not None:
            self.engine.draining = True          # responses carry Connection: close
        self.gate.leave_board()
        if self.control is not None and self._listeners_deleted.acquire(blocking=False):
            self._delete_listeners(self.control, drain=True)
            self._take_queued()
        self._draining_now = True
        self._draining.set()
        for th in self.loop_threads:
            self.table.wake(th.tid)

    def _delete_listeners(self, th, *, drain: bool = False) -> None:
        """Deletes the listeners (any thread may delete any fd; deferred to
        a thread still inside one, accepting). With drain: a dup of each is
        kept until the delete is complete, then its queue is emptied here
        (_accept_stragglers): a listener is polled EXCLUSIVE, and a
        connection whose wake-up went to one of our pollers just before the
        delete would wait, unaccepted, for the next one to arrive (review:
        at a reload's commit, two idle new workers and one queued client)."""
        for fd in list(self.listeners):
            if drain:
                try:
                    self._stragglers.append((os.dup(fd), fd, self.table.dump(fd).generation))
                except OSError as exc:
                    log.warning("listener fd %d: cannot keep it to empty its queue: %s", fd,
                                exc.strerror)
            th.delete(fd)
        self.listeners.clear()

    def _take_queued(self) -> None:
        """drain()'s thread (the main one, whatever the loop threads are
        doing): what is queued on the deleted listeners is accepted now and
        each dup closed, so from here on new connections are refused, not
        queued behind a slow handler and served late or reset at the
        worker's exit (review, TERM with the only loop thread in a 3 s
        handler). Each accepted fd goes to a loop thread that is not in app
        code if there is one (served at once), else to the first, which
        serves it once its handler returns. A listener whose delete is
        deferred has a loop thread inside it, accepting: its own drain step
        empties it (_accept_stragglers). With no loop thread left, nothing
        is taken: the queue is the other workers' to serve (taken here, each
        was only refused at our exit)."""
        if not self.threads_alive:
            while self._stragglers:
                os.close(self._stragglers.pop()[0])
            return
        self._empty_queued(self._post_accepted)

    def _post_accepted(self, fd: int) -> None:
        """fd to a live loop thread's mail: one not in app code if there is
        one. Under _posted_lock, so a thread that ends meanwhile (_ended,
        same lock) either is not chosen or finds the fd in its mail and
        passes it on; with no thread left it stays in _posted for
        refuse_posted."""
        with self._posted_lock:
            self._posted[fd] = time.monotonic()   # not drained until it is adopted
            me = self._mail_posted(fd)
        if me is not None:
            self.table.wake(self.loop_threads[me].tid)

    def _mail_posted(self, fd: int) -> int | None:
        """Under _posted_lock, fd in _posted: its adoption into a live loop
        thread's mail; that thread's position, or None if none is left."""
        alive = [i for i in range(len(self.loop_threads)) if i not in self.ended]
        if not alive:
            return None
        me = next((i for i in alive if not self.relief.busy[i]), alive[0])
        self._mail[me].append((self._adopt_posted, (me, fd)))
        return me

    def _adopt_posted(self, me: int, fd: int) -> None:
        """_take_queued's connection, on loop thread `me` (its mail), unless
        refuse_posted took it first."""
        with self._posted_lock:
            if fd not in self._posted:
                return                       # refused at the drain's deadline
            del self._posted[fd]
            self._adopting += 1              # still counted until it is in conns
        try:
            self._adopt_accepted(self.loop_threads[me], me, fd)
        finally:
            with self._posted_lock:
                self._adopting -= 1

    def posted_due(self, wait: float) -> float | None:
        """When the oldest connection _take_queued posted will have waited
        `wait` seconds for a loop thread (monotonic), or None: none waits."""
        with self._posted_lock:
            return min(self._posted.values()) + wait if self._posted else None

    def refuse_posted(self, linger: float = 0.5, waited: float = 0.0) -> int:
        """The main thread: connections _take_queued accepted that no loop
        thread got to in `waited` seconds (each was busy in the app) are
        refused rather than held behind a slow handler or reset by our
        exit: an HTTP interface's client gets a 503 (Connection: close)
        after its unread input is read, then a FIN; a stream client, and
        a client of a TLS listener, gets the FIN alone. With waited 0 (the
        drain's deadline, or no loop thread left): all of them. Returns how
        many."""
        now = time.monotonic()
        with self._posted_lock:
            fds = [fd for fd, at in self._posted.items() if now - at >= waited]
            for fd in fds:
                del self._posted[fd]
        if not fds:
            return 0
        # a Date as on every response the engine makes itself (RFC 9110 6.6.1)
        date = email.utils.formatdate(usegmt=True).encode()
        answer = (b"HTTP/1.1 503 Service Unavailable\r\nDate: " + date + b"\r\n"
                  b"Content-Type: text/plain\r\nContent-Length: 34\r\nConnection: close\r\n\r\n"
                  b"503 Service Unavailable: stopping\n") if self.engine is not None else b""
        socks = []
        for fd in fds:
            # a TLS client is closed without a byte: a 503 in clear would be
            # a garbled handshake to it (nginx and HAProxy close too)
            tls = fd in self._tls_accepted
            self._tls_accepted.discard(fd)
            s = socket.socket(fileno=fd)
            s.setblocking(False)
            try:
                while s.recv(65536):         # the request it sent: a close with
                    pass                     # unread input would be a reset
            except OSError:
                pass
            try:
                if not tls:
                    s.send(answer)
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            socks.append(s)
        end = time.monotonic() + linger      # what it sends meanwhile, read too
        while socks and time.monotonic() < end:
            ready, _, _ = select.select(socks, [], [], max(0.0, end - time.monotonic()))
            for s in ready:
                try:
                    if s.recv(65536):
                        continue
                except OSError:
                    pass
                socks.remove(s)
                s.close()
        for s in socks:
            s.close()
        log.warning("drain: refused %d queued connection(s) no loop thread got to%s", len(fds),
                    f" in {waited:g} s" if waited else "")
        return len(fds)

    def _accept_stragglers(self, th, me: int) -> int:
        """A draining thread's part of _delete_listeners(drain=True): once no
        poller of ours can take a deleted listener's wake-ups (_unpolled),
        new connections wake the other workers' pollers; what is queued now
        came before, and is taken and served here (Connection: close).
        Returns a poll timeout (ms) while one is still polled, else -1."""
        deferred = self._empty_queued(lambda fd: self._adopt_accepted(th, me, fd))
        return 10 if deferred else -1

    def _empty_queued(self, adopt) -> bool:
        """Accepts what is queued on each deleted listener that no poller of
        ours can take a wake-up of any more (_unpolled; adopt(fd) each),
        closing its dup; True if some is still polled (its straggler kept
        for later)."""
        later, taken = [], 0
        while self._stragglers:
            try:
                dup, fd, gen = self._stragglers.pop()
            except IndexError:
                break                       # another thread took the last one
            if not self._unpolled(fd, gen):
                later.append((dup, fd, gen))
                continue
            try:
                while True:
                    try:
                        conn, _ = _accept_raw(dup)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as exc:
                        log.warning("emptying a deleted listener: %s", exc.strerror)
                        break
                    taken += 1
                    if self._tls and fd not in self.plain_listeners:
                        self._tls_accepted.add(conn)
                    adopt(conn)
            finally:
                os.close(dup)
        self._stragglers.extend(later)
        if taken:
            log.info("drain: took %d connection(s) queued on a deleted listener", taken)
        return bool(later)

    def _unpolled(self, fd: int, gen: int) -> bool:
        """Whether no poller of ours can take the wake-up of a connection
        queued on deleted listener fd (incarnation gen) any more: its delete
        is complete (released), or the only threads still registered are
        inside it (running: the delete is deferred to them). Such a thread
        never waits in epoll before leaving it, and the last one to leave
        closes it, so the kernel hands new connections to other workers.
        Waiting for released alone stranded a connection (review, `-t 2`,
        one thread stuck in app code it reached from the accept): the idle
        sibling's EXCLUSIVE registration outlived the delete, took the next
        connection's wake-up, found the listener no longer its own and
        dropped it, and nobody accepted the connection until the stuck
        call ended (tests/master/test_drain_never_strands_a_queued_connection.py)."""
        if self.table.released(fd, gen):
            return True
        info = self.table.dump(fd)
        return info.generation != gen or not info.polled_recv & ~info.running_mask

    def _adopt_accepted(self, th, me: int, fd: int) -> None:
        """A connection accepted outside fdcore's accept, made ours."""
        tls = fd in self._tls_accepted
        self._tls_accepted.discard(fd)
        if self.engine is not None:
            self.engine.take(me, fd, not tls)
            self.gate.publish()
            return
        conn = self._register(th, fd)
        if conn is not None:
            conn.connect()

    def _register(self, th, fd: int) -> Connection | None:
        """An accepted fd into the table (owned by th) and into conns as a
        stream Connection; None if the table refused it (closed then)."""
        try:
            handler = self.handler_class()
        except BaseException as exc:  # noqa: BLE001 - contained: this connection ends
            # the app's code, as any handler method: it ends this connection
            # (a FIN, its input read first), never the loop thread (review)
            log.error("stream handler %s() failed (%s); closing the connection",
                      getattr(self.handler_class, "__name__", self.handler_class),
                      type(exc).__name__, exc_info=exc)
            read_unread(fd)
            os.close(fd)
            return None
        cookie = next(self._cookies)
        try:
            socket_opt_nodelay(fd)
            self.table.insert(fd, cookie, tgid=th.tgid, thread_mask=th.bit, kind=KIND_CONN,
                              accepted=True)
        except OSError:
            log.exception("cannot take connection fd %d", fd)
            os.close(fd)
            return None
        conn = Connection(self, th, fd, cookie, handler)
        self.conns[fd] = conn
        return conn

    def _drain_step(self, th, me: int) -> int:
        """A draining thread's turn: delete the listeners (the first thread to
        get here), close its own connections idle for the grace, and return
        the poll timeout until its next idle deadline (-1: none left). A
        connection with a request waiting (readable now: it arrived while this
        thread was busy elsewhere) is not idle, whatever its last event says."""
        if self._listeners_deleted.acquire(blocking=False):
            self._delete_listeners(th, drain=True)
        straggling = self._accept_stragglers(th, me) if self._stragglers else -1
        mine = [c for c in list(self.conns.values()) if c.th is th]
        if self._tells_drain:
            self._tell_drain(th, me, mine)
        now = time.monotonic()
        due_now, next_due = [], None
        for conn in mine:
            due = conn.last_active + self.idle_grace
            if conn.pending or getattr(conn, "buffering", False):
                # not idle while a request body arrives (its body timer
                # ends a stalled one) nor while output waits, and no
                # deadline to wake for: its flush (its body's read) is an event (a turn, this step again) that moves
                # last_active; one past due here asked poll for 1 ms waits,
                # a spin until the client read (review)
                continue
            if due <= now:
                due_now.append(conn)
            else:
                next_due = due if next_due is None else min(next_due, due)
        if due_now:
            # (a stream connection's input at its end is always readable: not
            # a request waiting; conns also holds the HTTP engine's, which
            # have no input_ended)
            waiting = ready_now({c.fd: select.POLLIN for c in due_now
                                 if not getattr(c, "input_ended", False)})
            self._enter_app(me)                  # on_close is app code: watched too
            for conn in due_now:
                if conn.fd in waiting:
                    conn.last_active = now
                    due = now + self.idle_grace
                    next_due = due if next_due is None else min(next_due, due)
                else:
                    conn.close()
            self.relief.busy[me] = 0.0
        if not self.conns and not self._stragglers and not self._posted and not self._adopting \
                and not self.drained.is_set():
            self.drained.set()
            os.eventfd_write(self.drained_fd, 1)
        if next_due is None:
            return straggling
        return _sooner(straggling, max(1, int((next_due - now) * 1000) + 1))

    def _tell_drain(self, th, me: int, mine: list[Connection]) -> None:
        """on_drain, once, to each of th's connections not told yet (one
        that connects while draining is told by its connect()), under the
        fd's running bit like any handler."""
        for conn in mine:
            if conn.told_drain or not conn.connected or conn.closed:
                continue
            outcome, gen = th.enter(conn.fd)
            if outcome is not Outcome.DONE:
                continue
            try:
                if conn.th is th:
                    self._enter_app(me)
                    conn.tell_drain()
                    self.relief.busy[me] = 0.0
            finally:
                th.leave(conn.fd, gen)

    def _enter_app(self, me: int) -> None:
        """Marks loop thread `me` as inside app code from now (the watchdog's
        stamp; the store comes before the read of its sleep flag)."""
        self.relief.busy[me] = time.monotonic()
        if self.relief.asleep:
            self.relief.wake()

    def _run(self, th) -> None:
        me = self._pos[th.tid]
        self.local.th = th
        if self.engine is not None:
            self.engine.bind(me)
        try:
            turn = self._turner(th, me)
            if self.asgi:
                # the thread's asyncio loop runs it: each of its iterations
                # is one turn (worker/aio.py; asyncio imported only for it)
                from sockherd.worker import aio
                aio.run(self, th, me, turn, self._aio_started[me].set)
            else:
                while not self._stopping:
                    turn(-1)
        except BaseException as exc:  # noqa: BLE001 - a loop thread's end, reported
            self._ended(th, me, exc)

    def _turner(self, th, me: int):
        """One turn of loop thread `me`'s body as a function of its own
        state: turn(wait_ms) polls at most wait_ms (-1: no bound of the
        caller's) and more only as the thread's own deadlines allow, runs
        what came (connections, listeners, mail, timers, the drain step, the
        relief), and returns the reports of the app's own fds (KIND_AIO,
        worker/aio.py), left already."""
        relief = self.relief
        busy = relief.busy
        relieved = relief.enabled and bool(relief.siblings(me))
        mail = self._mail[me]
        heap = self._timers[me]
        engine = self.engine
        asgi = self.asgi
        no_reports: list = []

        def turn(wait: int) -> list:
            app = no_reports
            # (the call only during a pause: a turn's cost, see _stopping)
            timeout = self._resume_accepting(th) if self._accept_paused_until else -1
            # asyncio's bound (aio.py); a WSGI turn has none. _sooner(wait,
            # timeout) inline: a call is ~250 instructions of an ASGI
            # request's turn (callgrind)
            if wait >= 0 and (timeout < 0 or wait < timeout):
                timeout = wait
            if self.gate.reasons:
                timeout = _sooner(timeout, self.gate.tick(th))
            if self._draining_now:
                timeout = _sooner(timeout, self._drain_step(th, me))
            if heap:
                timeout = _sooner(timeout, _ms_until(heap[0][0]))
            if engine is not None:
                # the connections' reports are handled in there; what
                # comes back is the listeners' (held, or left if relieved)
                # and the app's own fds' (asgi)
                handled, events = engine.turn(me, timeout, relieved)
                if handled:
                    relief.activity += 1
                if events and asgi:
                    app = [ev for ev in events if ev.kind == KIND_AIO]
                    if app:
                        if not relieved:
                            for ev in app:       # asyncio's now: held by no one
                                th.leave(ev.fd, ev.gen)
                        events = [ev for ev in events if ev.kind != KIND_AIO]
                if events:
                    relief.activity += 1
                    self._enter_app(me)
                    if relieved:
                        self._dispatch_entering(th, me, events)
                    else:
                        try:
                            self._dispatch_held(th, me, events)
                        finally:
                            for ev in events:
                                th.leave(ev.fd, ev.gen)
                    busy[me] = 0.0
            else:
                events = th.poll(timeout)
                if events:
                    relief.activity += 1
                    self._enter_app(me)
                    if relieved:
                        th.leave_all()       # siblings may take what we have not reached
                        self._dispatch_entering(th, me, events)
                    else:
                        self._dispatch_held(th, me, events)
                        th.leave_all()
                    busy[me] = 0.0
            if mail:
                self._enter_app(me)
                while mail:
                    fn, args = mail.popleft()
                    fn(*args)
                busy[me] = 0.0
            if heap and heap[0][0] <= time.monotonic():
                self._fire_timers(th, me, heap)
            if relief.asked[me] is not None:
                relief.take_from(th, me)
            return app

        return turn

    def aio_loop(self, i: int):
        """Loop thread i's asyncio loop (an ASGI app's), running once
        start() returned; None for another interface."""
        return self._aio[i] if self.asgi else None

    @property
    def open_connections(self) -> int:
        """Connections open now (the engine's for HTTP, else conns)."""
        return self.engine.count if self.engine is not None else len(self.conns)

    @property
    def threads_alive(self) -> int:
        """Loop threads still running their loop (the worker's report)."""
        return len(self.loop_threads) - len(self.ended)

    def _ended(self, th, me: int, exc: BaseException) -> None:
        """Loop thread `me` ends (a bug of ours: the app's errors are
        contained before they get here). What it owned is nobody's now:
        its batch is left and its connections closed, so their clients see
        an end instead of waiting forever (a request in flight on it is
        lost; the other threads' are not). Then the main thread is told
        (failed_fd): it stops accepting, drains and exits to be replaced."""
        self.errors.append(exc)
        with self._posted_lock:
            self.ended.add(me)
            # connections posted to us that we will never adopt: to a live
            # sibling (the drain waits for them; found by a CI run where one
            # waited out the whole drain deadline in a dead thread's mail)
            # (refuse_posted may have taken them already: not in _posted then)
            mail, woken = self._mail[me], set()
            while mail:                      # popleft: others may append meanwhile
                fn, args = mail.popleft()
                if fn == self._adopt_posted and args[1] in self._posted:
                    woken.add(self._mail_posted(args[1]))
        for pos in woken - {None}:
            self.table.wake(self.loop_threads[pos].tid)
        self.relief.busy[me] = 0.0
        # never picked by the watchdog as the idle sibling to relieve another
        # (a non-None ask is one in progress): nobody would ever take it
        self.relief.asked[me] = me
        log.critical("loop thread %d ended (%s), %d of %d left: this worker stops accepting, "
                     "drains and exits to be replaced", th.tid, type(exc).__name__,
                     self.threads_alive, len(self.loop_threads), exc_info=exc)
        try:
            th.leave_all()
            for conn in [c for c in list(self.conns.values()) if c.th is th]:
                conn._close_now()
        except BaseException:  # noqa: BLE001 - the main thread must still be told
            log.exception("loop thread %d: closing its connections failed", th.tid)
        finally:
            os.eventfd_write(self.failed_fd, 1)

    # ---- connection timers -------------------------------------------------------------
    def arm(self, conn: Connection, when: float) -> None:
        """Puts conn's deadline in its owner's heap, unless an entry at or
        before `when` is there already (it re-arms itself when it fires
        early). The owner's loop thread only (others post it there)."""
        if getattr(self.local, "th", None) is not conn.th:
            self.post(conn, self.arm, conn, when)
            return
        if conn.timer_entry and conn.timer_entry <= when:
            return
        conn.timer_entry = when
        heapq.heappush(self._timers[self._pos[conn.th.tid]], (when, next(self._timer_seq), conn))

    def _fire_timers(self, th, me: int, heap: list) -> None:
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            when, _, conn = heapq.heappop(heap)
            if conn.timer_entry != when:
                continue                         # superseded by an earlier entry
            conn.timer_entry = 0.0
            if conn.closed or not conn.timer_at:
                continue                         # closed, or cancelled
            if conn.th is not th:                # taken over: its new owner's heap
                self.post(conn, self.arm, conn, conn.timer_at)
                continue
            if conn.timer_at > now:              # moved later meanwhile
                self.arm(conn, conn.timer_at)
                continue
            # the handler runs under the running bit, as for an event
            outcome, gen = th.enter(conn.fd)
            if outcome is not Outcome.DONE:
                continue
            try:
                if conn.th is th and not conn.closed and conn.timer_at and conn.timer_at <= now:
                    conn.timer_at = 0.0
                    self._enter_app(me)
                    conn.timed_out()
                    self.relief.busy[me] = 0.0
            finally:
                th.leave(conn.fd, gen)

    def _dispatch_held(self, th, me: int, events) -> None:
        """A batch whose fds th holds until the caller leaves them all."""
        busy = self.relief.busy
        clock = time.monotonic
        conns = self.conns
        for ev in events:
            busy[me] = clock()
            if ev.kind == KIND_LISTENER:
                self._accept(th, ev.fd, False)
                continue
            conn = conns.get(ev.fd)
            if conn is not None and conn.cookie == ev.owner and conn.th is th:
                conn.on_events(ev.events)

    def _dispatch_entering(self, th, me: int, events) -> None:
        """A batch already left: each fd is entered again right before its
        handler, and skipped if a sibling took it meanwhile (or it closed)."""
        busy = self.relief.busy
        clock = time.monotonic
        conns = self.conns
        done = Outcome.DONE
        for ev in events:
            busy[me] = clock()
            conn = None
            if ev.kind != KIND_LISTENER:
                conn = conns.get(ev.fd)
                if conn is None or conn.cookie != ev.owner or conn.th is not th:
                    continue
            outcome, gen = th.enter(ev.fd)
            if outcome is not done:
                continue
            if gen == ev.gen:                    # else a new incarnation: not this report's
                if conn is None:
                    self._accept(th, ev.fd, True)
                elif conn.th is th:
                    conn.on_events(ev.events)
            th.leave(ev.fd, gen)

    @property
    def takeovers(self) -> list[int]:
        return self.relief.takeovers

    def _accept(self, th, lfd: int, relieved: bool) -> None:
        if time.monotonic() < self._accept_paused_until:
            return
        batch = self.accept_batch
        if self.max_connections:
            batch = min(batch, self.max_connections - len(self.conns))
            if batch <= 0:
                self._cap(th)
                return
        room = self.gate.room(batch)
        ahead = room == 0
        # ahead: this arrival's wake-up came to us: take it, then yield
        batch = 1 if ahead else room
        if self.engine is not None:
            self._accept_native(th, lfd, batch, ahead)
            return
        try:
            fds = th.accept(lfd, batch)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self._pause_accepting(th, exc)
                return
            raise
        if fds and self.rotate_accept:
            self._requeue(th, lfd)
        if ahead:
            self.gate.balance_off(th)
        # the whole batch is in the table and in conns before any on_connect
        # runs: a slow one must not hide the others from a relieving sibling
        new = [conn for fd in fds if (conn := self._register(th, fd)) is not None]
        self.gate.publish()
        busy = self.relief.busy
        me = self._pos[th.tid]
        for conn in new:
            busy[me] = time.monotonic()
            if not relieved:
                conn.connect()
                continue
            # on_connect under the running bit, as any handler: a sibling
            # that took the connection meanwhile runs it itself, first
            outcome, gen = th.enter(conn.fd)
            if outcome is Outcome.DONE:
                if conn.th is th:
                    conn.connect()
                th.leave(conn.fd, gen)

    def _accept_native(self, th, lfd: int, batch: int, ahead: bool) -> None:
        """The engine's accept: the batch taken, registered and reading in
        one C call (its connections need no on_connect from here)."""
        try:
            n = self.engine.accept(self._pos[th.tid], lfd, batch, lfd in self.plain_listeners)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self._pause_accepting(th, exc)
                return
            raise
        try:
            if n and self.rotate_accept:
                self._requeue(th, lfd)
            if ahead:
                self.gate.balance_off(th)
            self.gate.publish()
        finally:
            if n and self.engine.dispatch:
                # the app may run in here: the listener is done with first;
                # whatever happened there, what the first reads brought is
                # served (each such connection waits for it: engine.c)
                self.engine.serve_accepted(self._pos[th.tid])

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
            # EPERM / EBADF: not held or deleted by a drain; anything else
            # is a failed re-registration, which the next poll reports
            # (FDC_POLL_CTL) like any other: not a reason to end this thread
            if exc.errno not in (errno.EPERM, errno.EBADF):
                log.warning("listener fd %d: re-registration failed: %s", lfd, exc.strerror)

    def _cap(self, th) -> None:
        if CAP not in self.gate.reasons:
            self.paused_cap += 1
            log.warning("%d connections open (max_connections): not accepting until one "
                        "closes", len(self.conns))
        self.gate.off(th, CAP)
        if len(self.conns) < self.max_connections:      # one closed meanwhile
            self.gate.on(th, CAP)

    def _pause_accepting(self, th, exc: OSError) -> None:
        self._accept_paused_until = time.monotonic() + self.emfile_pause
        self.paused_emfile += 1
        if not self._emfile_logged:
            self._emfile_logged = True
            log.warning("%s; not accepting for %.1fs (logged once)", exc.strerror,
                        self.emfile_pause)
        # th's own context: a verb may touch the caller's local update list,
        # so never another running thread's (any fd of any group is fine)
        self.gate.off(th, EMFILE)

    def _resume_accepting(self, th) -> int:
        """Poll timeout: -1, or until accepting resumes (any thread resumes it)."""
        until = self._accept_paused_until
        if not until:
            return -1
        left = until - time.monotonic()
        if left > 0:
            return max(1, int(left * 1000))
        self._accept_paused_until = 0.0
        self.gate.on(th, EMFILE)
        return -1


def _accept_raw(lfd: int) -> tuple[int, None]:
    """One non-blocking accept on a listener fd we do not own as a socket
    object: (new fd, close-on-exec and non-blocking, None)."""
    s = socket.socket(fileno=lfd)
    try:
        s.setblocking(False)
        conn, _ = s.accept()
    finally:
        s.detach()
    conn.setblocking(False)
    return conn.detach(), None


def socket_opt_nodelay(fd: int) -> None:
    s = socket.socket(fileno=fd)
    try:
        if s.family in (socket.AF_INET, socket.AF_INET6):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        s.detach()



# the longest poll wait (ms): a timer further off wakes the thread early, and
# _fire_timers finds it not due yet (a 30-day timer is 2.6e9 ms: past poll's
# 32-bit timeout, an OverflowError that ended the loop thread, review)
_MAX_WAIT_MS = 3_600_000


def _ms_until(when: float) -> int:
    """A poll timeout (ms) until the monotonic time `when`, at most an hour."""
    return max(0, min(_MAX_WAIT_MS, int((when - time.monotonic()) * 1000) + 1))


def _sooner(a: int, b: int) -> int:
    """The sooner of two poll timeouts in ms (-1: none)."""
    if a < 0:
        return b
    return a if b < 0 else min(a, b)

