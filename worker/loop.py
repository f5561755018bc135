"""The worker's event loop: one thread per fdcore thread context, over the
listeners, with a stream handler class or the native HTTP engine.

This module holds the Loop's state (__init__), its set-up and its end
(add_listener, start, stop) and what the worker and the app ask of it; the
rest is in its parts, each a base class that calls only the parts below it:

  loop_turn.py    a loop thread's body: the turn, dispatch, its end
  loop_drain.py   the drain: listeners deleted, idle connections closed
  loop_queued.py  a drain's queued connections: taken, posted, or refused
  loop_accept.py  accepting: batches, registration, the EMFILE pause, the cap
  loop_timers.py  connection timers, a heap per loop thread
  loop_core.py    the fd kinds, the mailbox, the app-code stamp

Whether the listeners are polled at all is worker/gate.py's: not during an
EMFILE/ENFILE pause, not past max_connections, and not while this worker is
ahead of the others in open connections (the balance, worker/board.py).
Moving connections off a thread stuck in a handler is worker/relief.py's.
"""
from __future__ import annotations

import collections
import itertools
import os
import socket
import threading
import time

from sockherd.fdcore import Table
from sockherd.worker.gate import CAP, Gate
from sockherd.worker.loop_core import KIND_LISTENER
from sockherd.worker.loop_turn import LoopTurn
from sockherd.worker.relief import Relief
from sockherd.worker.stream import OUTPUT_LIMIT, Connection, water_marks


class Loop(LoopTurn):
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
        self._standby_now = False            # standby(): not accepting, not draining
        self._sweep = True                   # drain(): empty our listeners' queues (loop_drain.py)
        # standby(): its number, the one whose gate half a loop thread made
        self._standby_lock = threading.Lock()
        self._standby_seq = self._standby_made = 0
        self._step = None                    # _drain_step or _standby_step: each turn runs it
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
        # what the app raises never ends one (worker/native/app/wsgi/wsgi_app.c). The
        # worker's main thread watches failed_fd: it drains and exits, so
        # the master replaces the worker (channel_service.py); `errors` says why
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
        # the wsgi interface's native engine (worker/native/engine/engine.c): it
        # runs the connections' side of each turn; None for a stream handler
        make_engine = getattr(handler_class, "make_engine", None)
        self.engine = make_engine(self) if make_engine is not None else None
        self._tls = self.engine is not None and self.engine.tls_counts()["on"]
        # an ASGI app: each loop thread runs an asyncio loop on its poller
        # (worker/aio.py), its tasks the requests that thread serves
        self.asgi = self.engine is not None and self.engine.interface == "asgi"
        self._aio: list = [None] * len(self.loop_threads)
        self._aio_started = [threading.Event() for _ in self.loop_threads]

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

    @property
    def standing_by(self) -> bool:
        return self._standby_now

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

    def aio_loop(self, i: int):
        """Loop thread i's asyncio loop (an ASGI app's), running once
        start() returned; None for another interface."""
        return self._aio[i] if self.asgi else None

    @property
    def open_connections(self) -> int:
        """Connections open now (the engine's for HTTP, else conns)."""
        return self.engine.count if self.engine is not None else len(self.conns)

    @property
    def takeovers(self) -> list[int]:
        return self.relief.takeovers
