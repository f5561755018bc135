"""The metrics listener's bounds (issue 19, finding 2): anyone who can reach
the metrics address must not be able to take the master's threads or fds,
nor its readiness check.

- a fixed pool of POOL connections, a thread each; one accepted beyond it
  is answered 503 at once (a non-blocking send) and closed;
- an absolute deadline, REQUEST_DEADLINE from accept, to read the request
  (line and headers): a client dripping a header line now and then meets
  it, where a per-recv timeout never fires. The deadline ends at the
  request's last header, so a scrape waiting on the workers is not cut;
- the listen backlog of the app listeners (socketserver's 5 dropped SYNs
  under a burst of health checks: a 1 s retry each);
- a client that errs or is cut is one debug line, and one quiet line a
  minute at most in the log, never socketserver's traceback on stderr;
- nothing is accepted while fewer than fdbudget's metrics floor of fds are
  free (finding 3): the connection waits in the backlog, and the fds left
  stay for a control client (libzmq aborts on EMFILE) and a spawn.

Deadlines are enforced by the serving thread itself (service_actions, run
each round of serve_forever, 0.2 s at most): shutting the socket down ends
the handler's blocked read with an EOF, and its thread ends."""
from __future__ import annotations

import errno
import logging
import socket
import socketserver
import sys
import threading
import time

from sockherd.master.fdbudget import BUDGET

log = logging.getLogger("sockherd.master")

POOL = 64
REQUEST_DEADLINE = 5.0
BACKLOG = 2048               # the app listeners' default (settings.backlog)
LOG_EVERY = 60.0
SHORT_PAUSE = 0.05           # short of fds: the next look (the listener stays readable)
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 22\r\nConnection: close\r\n\r\nmetrics listener busy\n")


class Bounded(socketserver.ThreadingMixIn):
    """Mixed into the metrics server before its TCPServer base."""
    daemon_threads = True                 # a scrape waiting on the loop never holds an exit
    request_queue_size = BACKLOG

    def __init__(self, *args, **kw) -> None:
        self._slots = threading.BoundedSemaphore(POOL)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)   # notified as a request ends
        self._active = 0                  # requests whose thread runs
        self._deadlines: dict[socket.socket, float] = {}   # still reading its request
        self._errors = 0                  # since the last quiet line
        self._logged_at = 0.0
        self._short = False               # not accepting: too few fds free
        self._short_said = -LOG_EVERY     # when that was last logged
        self._waiting = threading.Event() # never set: a pause that is not a busy loop
        super().__init__(*args, **kw)

    def get_request(self):
        """accept(), only while the metrics floor of fds is free; else OSError
        (socketserver drops the round) after a short pause: the listening
        socket stays readable and serve_forever would spin on it."""
        floor = BUDGET.floors().metrics
        if not BUDGET.free_at_least(floor):
            if not self._short:
                self._short = True
                # a squeeze goes on and off as clients are cut: one line a minute
                now = time.monotonic()
                if now - self._short_said >= LOG_EVERY:
                    self._short_said = now
                    log.warning("metrics: fewer than %d fds free: not accepting until there "
                                "are (kept for control clients and spawns)", floor)
            self._waiting.wait(SHORT_PAUSE)
            raise OSError(errno.EMFILE, "fewer than the metrics listener's floor of fds free")
        if self._short:
            self._short = False
            log.debug("metrics: accepting again")
        got = super().get_request()
        BUDGET.taken()
        return got

    def shutdown_request(self, request) -> None:
        super().shutdown_request(request)   # every accepted connection ends here
        BUDGET.given()

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        with self._lock:
            self._deadlines[request] = time.monotonic() + REQUEST_DEADLINE
            self._active += 1
        try:
            threading.Thread(target=self._run, args=(request, client_address),
                             daemon=True).start()
        except RuntimeError:              # no thread to be had: refused like a full pool
            self._ended(request)
            self._refuse(request)

    def _run(self, request, client_address) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            self._ended(request)

    def _ended(self, request) -> None:
        self.request_read(request)
        self._slots.release()
        with self._lock:
            self._active -= 1
            self._idle.notify_all()

    def quiesce(self, timeout: float) -> bool:
        """After shutdown() (no more accepts: the kernel queues new
        connections on the listening socket, which an upgrade's new image
        accepts): waits up to timeout for the requests in flight to end,
        so the exec closes none under a client (a reset). True if none is
        left."""
        end = time.monotonic() + timeout
        with self._lock:
            while self._active and (left := end - time.monotonic()) > 0:
                self._idle.wait(left)
            return not self._active

    def _refuse(self, request) -> None:
        try:
            request.setblocking(False)
            request.send(BUSY)
        except OSError:
            pass
        self.shutdown_request(request)

    def request_read(self, request) -> None:
        """The request's headers are in (or it is done): no deadline now."""
        with self._lock:
            self._deadlines.pop(request, None)

    def service_actions(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [s for s, at in self._deadlines.items() if at <= now]
            for s in late:
                del self._deadlines[s]
        for s in late:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        super().service_actions()

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        log.debug("metrics: %s: %r", client_address, exc)
        now = time.monotonic()
        with self._lock:
            self._errors += 1
            if now - self._logged_at < LOG_EVERY:
                return
            n, self._errors, self._logged_at = self._errors, 0, now
        log.info("metrics: %d client connection(s) ended in error or past the %gs "
                 "deadline (the last: %s)", n, REQUEST_DEADLINE, type(exc).__name__)
