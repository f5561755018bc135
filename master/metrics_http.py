"""The metrics listener's HTTP side, bounded (issue 19, finding 2): anyone
who can reach the metrics address must not be able to take the master's
threads or fds, nor its readiness check.

One thread (the reader) accepts and reads every connection's request head
in a selector, HEADS connections at most, each under an absolute deadline
(REQUEST_DEADLINE from its accept, not per recv: a client dripping a
header line now and then meets it). The reader answers what is cheap
itself, at once: /-/ready (plain attribute reads, inspect.readiness), the
redirect, 404, 405, and its own refusals. Only a complete request for a
page that waits on the master's loop (/metrics, /-/status: SLOW) takes one
of POOL threads; with none free it is answered 503 at once. So /-/ready
never waits for a slot, whatever holds the pool or the head readers.

A connection beyond HEADS evicts the one that has been reading its head
the longest (a dripper, never a prompt client: a prompt client's head is
read within a round of the selector). The listen backlog is the app
listeners' (socketserver's 5 dropped SYNs under a burst of health checks:
a 1 s retry each). A client that errs, is cut or evicted is one debug
line, and one quiet line a minute at most in the log, never a traceback.

One request per connection (Connection: close), as wsgiref served it.

Nothing is accepted while fewer than fdbudget's metrics floor of fds are
free (issue 19, finding 3): the listening socket leaves the selector for
SHORT_PAUSE, the connection waits in the backlog, and the fds left stay
for a control client (libzmq aborts on EMFILE) and a spawn. Every accepted
connection is counted in the budget as taken, and as given at its close.
"""
from __future__ import annotations

import io
import logging
import selectors
import socket
import sys
import threading
import time
from urllib.parse import unquote

from sockherd.master.fdbudget import BUDGET

log = logging.getLogger("sockherd.master")

POOL = 8                     # requests waiting on the master's loop at once (scrapes join)
HEADS = 64                   # connections reading their request head
REQUEST_DEADLINE = 5.0       # from accept to the end of the request head
MAX_HEAD = 16 * 1024
BACKLOG = 2048               # the app listeners' default (settings.backlog)
SEND_TIMEOUT = 10.0          # a pool thread writing to a client that does not read
LOG_EVERY = 60.0
_ACCEPTS_PER_ROUND = 64
SHORT_PAUSE = 0.05           # short of fds: the next look
SLOW = frozenset({"/metrics", "/-/status", "/-/status.json"})


def _plain(status: str, text: str) -> bytes:
    body = text.encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}"
            f"\r\nConnection: close\r\n\r\n").encode() + body


BUSY = _plain("503 Service Unavailable", "metrics listener busy\n")


class _Head:
    """A connection still reading its request head."""

    __slots__ = ("sock", "peer", "deadline", "buf")

    def __init__(self, sock: socket.socket, peer, deadline: float):
        self.sock, self.peer, self.deadline = sock, peer, deadline
        self.buf = bytearray()


class Listener:
    """The listening socket, its reader and its pool. start() starts the
    reader thread; shutdown() ends it (from another thread)."""

    def __init__(self, sock: socket.socket, app):
        self.socket = sock
        self.server_address = sock.getsockname()
        self.app = app
        sock.setblocking(False)
        self._heads: dict[int, _Head] = {}    # fd -> head; oldest first
        self._slots = threading.BoundedSemaphore(POOL)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)   # notified as a pool request ends
        self._active = 0
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._drain = 0.0
        self._short_until: float | None = None   # out of the selector till then: short of fds
        self._short_said = -LOG_EVERY
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._errors = 0
        self._logged_at = -LOG_EVERY

    @classmethod
    def bind(cls, host: str, port: int, family: int, app) -> "Listener":
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            # re-bound at once by an upgrade's new image
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(BACKLOG)
        except BaseException:
            sock.close()
            raise
        return cls(sock, app)

    @classmethod
    def adopt(cls, fd: int, app) -> "Listener":
        """An upgrade's previous image's socket (an older one listened with a
        backlog of 5)."""
        sock = socket.socket(fileno=fd)
        sock.listen(BACKLOG)
        return cls(sock, app)

    # ---- the reader ----------------------------------------------------------------
    def start(self) -> threading.Thread:
        """The reader thread, started (again after a shutdown())."""
        self._stop.clear()
        self._stopped.clear()
        thread = threading.Thread(target=self._serve, name="sockherd-metrics", daemon=True)
        try:
            thread.start()
        except BaseException:
            self._stopped.set()
            raise
        return thread

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        self._short_until = None
        try:
            sel.register(self.socket, selectors.EVENT_READ, None)
            sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            self._rounds(sel)
        finally:
            for head in list(self._heads.values()):
                self._drop(sel, head, None)
            sel.close()
            self._stopped.set()

    def _rounds(self, sel) -> None:
        end = None
        while True:
            if self._stop.is_set():
                if end is None:                   # no more accepts: the heads may finish
                    end = time.monotonic() + self._drain
                    if self._short_until is None:
                        sel.unregister(self.socket)
                    self._short_until = None
                if not self._heads or time.monotonic() >= end:
                    return
            now = time.monotonic()
            due = min((h.deadline for h in self._heads.values()), default=None)
            if end is not None:
                due = end if due is None else min(due, end)
            if self._short_until is not None:
                due = self._short_until if due is None else min(due, self._short_until)
            for key, _ in sel.select(None if due is None else max(0.0, due - now)):
                if key.data == "wake":
                    try:
                        while self._wake_r.recv(64):
                            pass
                    except OSError:
                        pass
                    continue
                try:
                    if key.data is None:
                        self._accept(sel)
                    else:
                        self._read(sel, key.data)
                except Exception:                 # noqa: BLE001 - a bug of ours: one
                    log.exception("metrics: serving a request failed")   # client, not all
                    if isinstance(key.data, _Head):
                        self._drop(sel, key.data, None)
            now = time.monotonic()
            for head in [h for h in self._heads.values() if h.deadline <= now]:
                self._drop(sel, head, f"no complete request within {REQUEST_DEADLINE:g}s")
            if self._short_until is not None and now >= self._short_until and end is None:
                self._short_until = None              # look again: _accept checks the room
                sel.register(self.socket, selectors.EVENT_READ, None)

    def _accept(self, sel) -> None:
        for _ in range(_ACCEPTS_PER_ROUND):       # the selector reports the rest again
            if not self._room(sel):
                return
            try:
                conn, peer = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:                # EMFILE...: it waits in the backlog
                self._quiet(None, exc)
                return
            BUDGET.taken()
            conn.setblocking(False)
            if len(self._heads) >= HEADS:
                oldest = next(iter(self._heads.values()))
                self._drop(sel, oldest, "evicted: the head readers are full")
            head = _Head(conn, peer, time.monotonic() + REQUEST_DEADLINE)
            self._heads[conn.fileno()] = head
            sel.register(conn, selectors.EVENT_READ, head)
            self._read(sel, head)                 # it may have sent its request with the SYN

    def _room(self, sel) -> bool:
        """Whether the metrics floor of fds is free; if not, the listening
        socket is out of the selector for SHORT_PAUSE (it stays readable:
        the reader would spin on it), said once a minute at most."""
        floor = BUDGET.floors().metrics
        if BUDGET.free_at_least(floor):
            return True
        sel.unregister(self.socket)
        self._short_until = time.monotonic() + SHORT_PAUSE
        now = time.monotonic()
        if now - self._short_said >= LOG_EVERY:
            self._short_said = now
            log.warning("metrics: fewer than %d fds free: not accepting until there are (kept "
                        "for control clients and spawns)", floor)
        return False

    def _read(self, sel, head: _Head) -> None:
        try:
            data = head.sock.recv(MAX_HEAD + 1 - len(head.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(sel, head, exc)
            return
        if not data:
            self._drop(sel, head, "closed before its request was complete")
            return
        head.buf += data
        end = head.buf.find(b"\r\n\r\n")
        cut = end + 4
        if end < 0:
            end = head.buf.find(b"\n\n")
            cut = end + 2
        if end < 0:
            if len(head.buf) > MAX_HEAD:
                self._answer(sel, head, _plain("431 Request Header Fields Too Large",
                                               "request head too large\n"))
            return
        self._unlist(sel, head)
        try:
            environ = self._environ(bytes(head.buf[:cut]), head.peer)
        except ValueError as exc:
            self._quiet(head.peer, exc)
            self._send_close(head.sock, _plain("400 Bad Request", f"{exc}\n"))
            return
        if environ["PATH_INFO"] in SLOW and environ["REQUEST_METHOD"] in ("GET", "HEAD"):
            self._to_pool(head.sock, environ)
        else:
            self._send_close(head.sock, self._run(environ))

    # ---- requests ------------------------------------------------------------------------
    def _to_pool(self, sock: socket.socket, environ: dict) -> None:
        if not self._slots.acquire(blocking=False):
            self._send_close(sock, BUSY)
            return
        with self._lock:
            self._active += 1
        try:
            threading.Thread(target=self._serve_slow, args=(sock, environ),
                             name="sockherd-metrics-request", daemon=True).start()
        except RuntimeError:                      # no thread to be had: as a full pool
            self._ended()
            self._send_close(sock, BUSY)

    def _serve_slow(self, sock: socket.socket, environ: dict) -> None:
        try:
            response = self._run(environ)
            sock.settimeout(SEND_TIMEOUT)
            sock.sendall(response)
        except OSError as exc:
            self._quiet(environ.get("REMOTE_ADDR"), exc)
        finally:
            sock.close()
            BUDGET.given()
            self._ended()

    def _ended(self) -> None:
        self._slots.release()
        with self._lock:
            self._active -= 1
            self._idle.notify_all()

    def _run(self, environ: dict) -> bytes:
        """The app's whole response (status line, headers, body)."""
        got: list = []

        def start_response(status, headers, exc_info=None):
            got[:] = [status, headers]
            return lambda data: None              # write(): unused by our app

        try:
            result = self.app(environ, start_response)
            try:
                body = b"".join(result)
            finally:
                if hasattr(result, "close"):
                    result.close()
        except Exception:                         # noqa: BLE001 - our app's bug, answered
            log.exception("metrics: %s %s failed", environ["REQUEST_METHOD"],
                          environ["PATH_INFO"])
            return _plain("500 Internal Server Error", "internal error\n")
        status, headers = got
        lines = [f"HTTP/1.1 {status}"]
        lines += [f"{k}: {v}" for k, v in headers if k.lower() != "connection"]
        if not any(k.lower() == "content-length" for k, _ in headers):
            lines.append(f"Content-Length: {len(body)}")
        lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    def _environ(self, raw: bytes, peer) -> dict:
        """A WSGI environ from a request head; ValueError if it is no HTTP/1 request."""
        text = raw.decode("latin-1")
        line, _, rest = text.partition("\n")
        parts = line.strip().split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise ValueError(f"bad request line {line.strip()[:80]!r}")
        method, target, version = parts
        path, _, query = target.partition("?")
        env = {
            "REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": unquote(path, "latin-1"),
            "QUERY_STRING": query, "SERVER_PROTOCOL": version,
            "SERVER_NAME": str(self.server_address[0]), "SERVER_PORT": str(self.server_address[1]),
            "REMOTE_ADDR": str(peer[0]) if peer else "", "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(), "wsgi.errors": sys.stderr,
            "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
        }
        for header in rest.split("\n"):
            header = header.strip()
            if not header:
                continue
            name, colon, value = header.partition(":")
            if not colon or not name or name != name.strip():
                raise ValueError(f"bad header line {header[:80]!r}")
            key = name.upper().replace("-", "_")
            if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                env[key] = value.strip()
            elif "HTTP_" + key in env:
                env["HTTP_" + key] += "," + value.strip()
            else:
                env["HTTP_" + key] = value.strip()
        return env

    # ---- connections ---------------------------------------------------------------------
    def _answer(self, sel, head: _Head, response: bytes) -> None:
        self._unlist(sel, head)
        self._quiet(head.peer, "request head too large")
        self._send_close(head.sock, response)

    def _send_close(self, sock: socket.socket, response: bytes) -> None:
        """A small answer from the reader: what the socket takes now (a fresh
        connection's buffer takes it all), never a wait."""
        try:
            sock.send(response)
        except OSError:
            pass
        sock.close()
        BUDGET.given()

    def _unlist(self, sel, head: _Head) -> None:
        self._heads.pop(head.sock.fileno(), None)
        try:
            sel.unregister(head.sock)
        except (KeyError, ValueError):
            pass

    def _drop(self, sel, head: _Head, why) -> None:
        self._unlist(sel, head)
        if why is not None:
            self._quiet(head.peer, why)
        try:
            head.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        head.sock.close()
        BUDGET.given()

    def _quiet(self, peer, why) -> None:
        """A client's error or cut: a debug line, and a count in a quiet
        line at most every LOG_EVERY seconds."""
        log.debug("metrics: %s: %s", peer, why)
        now = time.monotonic()
        with self._lock:
            self._errors += 1
            if now - self._logged_at < LOG_EVERY:
                return
            n, self._errors, self._logged_at = self._errors, 0, now
        log.info("metrics: %d client connection(s) ended in error, cut or past the %gs "
                 "deadline (the last: %s)", n, REQUEST_DEADLINE,
                 why if isinstance(why, str) else type(why).__name__)

    # ---- from other threads ----------------------------------------------------------------
    def shutdown(self, drain: float = 0.0) -> None:
        """Stop accepting (new connections wait in the backlog: an upgrade's
        new image takes them) and end the reader; the heads already read
        get `drain` seconds to finish. Returns once the reader ended."""
        self._drain = drain
        self._stop.set()
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        self._stopped.wait()

    def quiesce(self, timeout: float) -> bool:
        """After shutdown(): waits up to timeout for the pool's requests to
        end, so an exec closes none under a client. True if none is left."""
        end = time.monotonic() + timeout
        with self._lock:
            while self._active and (left := end - time.monotonic()) > 0:
                self._idle.wait(left)
            return not self._active

    def server_close(self) -> None:
        self.socket.close()
        self._wake_r.close()
        self._wake_w.close()
