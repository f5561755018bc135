"""The `wsgi` interface (PEP 3333) over the worker loop.

The request path's parsing and environ construction are native
(worker/native: llhttp, strict, one C call per request head); this module
runs the app and writes its response. One WSGIConnection per connection, as
a stream handler: bytes in, parsed on demand, requests answered in order
(pipelining), keep-alive by default on HTTP/1.1.

The app runs in the loop thread that owns the connection. While it runs,
`wsgi.input` reads the body straight from the socket (waiting for it with
poll, bounded by `body_timeout`), so a large upload is never held whole in
memory; `Expect: 100-continue` is answered when the app first reads.

Timers (Connection.set_timer, no thread): a request head must arrive whole
within `header_timeout` of its first byte (else 408 and close: slowloris),
and an idle kept-alive connection closes after `keepalive_timeout`.

`wsgi.file_wrapper` sends a regular file with sendfile(2).

Not here yet (the HTTP issue's later parts): serialisation and writes in
native code.
"""
from __future__ import annotations

import logging
import os
import select
import stat
import sys
import time
from email.utils import formatdate

from sockherd.worker._http import HttpError, RequestParser, response_head
from sockherd.worker.stream import HIGH_WATER, LOW_WATER, wait_ready

log = logging.getLogger("sockherd.worker")

REASONS = {400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large",
           414: "URI Too Long", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 505: "HTTP Version Not Supported"}


MIN_BODY_RATE = 64 << 10       # bytes/s a request body must average past body_timeout


class ClientGone(Exception):
    """The client closed or reset the connection while the app read or wrote."""


class BadBody(Exception):
    """The request body's framing is invalid: args (status, reason). The
    connection cannot carry another request."""


class _Limits:
    def __init__(self, cfg: dict):
        self.line = int(cfg.get("limit_request_line", 8190))
        self.header_bytes = int(cfg.get("limit_request_header_bytes", 32768))
        self.headers = int(cfg.get("limit_request_fields", 100))
        self.body = int(cfg.get("limit_request_body", 0))
        self.body_timeout = float(cfg.get("body_timeout", 30.0))
        self.root_path = str(cfg.get("root_path", ""))
        self.server_header = str(cfg.get("server_header", ""))
        self.server_line = (b"Server: %s\r\n" % self.server_header.encode("latin-1")
                            if self.server_header else b"")
        self.access = AccessLog(str(cfg.get("access_log_format", ""))) \
            if cfg.get("access_log") else None
        self.header_timeout = float(cfg.get("header_timeout", 15.0))
        self.keepalive_timeout = float(cfg.get("keepalive_timeout", 75.0))
        self.multithread = int(cfg.get("threads", 1)) > 1


class AccessLog:
    """One line per request in gunicorn's format atoms: h remote address,
    t time, r request line, m method, U path, q query, H protocol, s status,
    b body bytes sent ('-' for none), f Referer, a User-Agent, L seconds
    (decimal), D microseconds, p pid."""

    log = logging.getLogger("sockherd.access")

    def __init__(self, fmt: str):
        self.fmt = fmt

    def __call__(self, env: dict, status: str | None, sent: int, started: float) -> None:
        took = time.monotonic() - started
        line = f'{env["REQUEST_METHOD"]} {env["RAW_URI"]} {env["SERVER_PROTOCOL"]}'
        atoms = _Atoms(h=env.get("REMOTE_ADDR") or "-",
                       t=time.strftime("%d/%b/%Y:%H:%M:%S %z"), r=line,
                       m=env["REQUEST_METHOD"], U=env["PATH_INFO"], q=env["QUERY_STRING"],
                       H=env["SERVER_PROTOCOL"], s=(status or "-")[:3], b=sent or "-",
                       f=env.get("HTTP_REFERER", "-"), a=env.get("HTTP_USER_AGENT", "-"),
                       L=f"{took:.6f}", D=int(took * 1e6), p=os.getpid())
        try:
            self.log.info(self.fmt % atoms)
        except (KeyError, TypeError, ValueError) as exc:
            self.log.error("access_log_format %r: %s", self.fmt, exc)


class _Atoms(dict):
    def __missing__(self, key):
        return "-"                              # unknown atoms print as '-', as gunicorn


def make_handler(app, cfg: dict):
    """The stream handler class serving `app` with the settings cfg."""
    limits = _Limits(cfg)

    class Handler(WSGIConnection):
        __slots__ = ()
        shared = None          # the environ keys of every request of the worker

    Handler.app = staticmethod(app)
    Handler.limits = limits
    return Handler


class Input:
    """wsgi.input: the current request's body, read on demand from the
    parser's buffer and, when that is empty, from the socket itself."""

    def __init__(self, owner: "WSGIConnection"):
        self._owner = owner

    def _more(self) -> bytes:
        return self._owner._body_chunk()

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            parts = []
            while chunk := self._more():
                parts.append(chunk)
            return b"".join(parts)
        out = bytearray()
        while len(out) < size:
            chunk = self._owner._body_chunk(size - len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)

    def readline(self, size: int | None = -1) -> bytes:
        out = bytearray()
        while size is None or size < 0 or len(out) < size:
            chunk = self._owner._body_peekline(-1 if size is None or size < 0
                                               else size - len(out))
            if not chunk:
                break
            out += chunk
            if chunk.endswith(b"\n"):
                break
        return bytes(out)

    def readlines(self, hint: int = -1) -> list[bytes]:
        lines, total = [], 0
        while line := self.readline():
            lines.append(line)
            total += len(line)
            if 0 < hint <= total:
                break
        return lines

    def __iter__(self):
        while line := self.readline():
            yield line


class FileWrapper:
    """wsgi.file_wrapper: a regular file is sent with sendfile(2) (the
    kernel copies it, no Python loop); anything else is iterated in blocks."""

    def __init__(self, filelike, blksize: int = 65536):
        self.filelike = filelike
        self.blksize = blksize
        if hasattr(filelike, "close"):
            self.close = filelike.close

    def __iter__(self):
        read = self.filelike.read
        while block := read(self.blksize):
            yield block

    def regular_fd(self) -> int:
        """The file's descriptor if it is a regular file, else -1."""
        try:
            fd = self.filelike.fileno()
            return fd if stat.S_ISREG(os.fstat(fd).st_mode) else -1
        except (AttributeError, OSError, ValueError):
            return -1


class WSGIConnection:
    """Stream handler for one HTTP/1.1 connection (see the module doc)."""

    # small: an idle kept-alive connection should cost little (bench/RESULTS.md)
    __slots__ = ("conn", "parser", "addr", "_unread", "_continue_due", "_busy", "_head_clock",
                 "_body_deadline", "_resp")
    app = None            # set by make_handler
    limits: _Limits
    shared: dict | None

    def on_connect(self, conn) -> None:
        lim = self.limits
        self.conn = conn
        self.parser = RequestParser(max_line=lim.line, max_header_bytes=lim.header_bytes,
                                    max_headers=lim.headers, max_body=lim.body,
                                    script_name=lim.root_path)
        if self.shared is None:
            type(self).shared = _shared_environ(conn.loop, lim)
        self.addr = _addresses(conn)
        self._unread = b""            # body bytes taken from the parser, not yet read
        self._continue_due = False
        self._busy = False
        self._body_deadline = None
        self._resp = None
        self._head_clock = True               # the first head: from the connection on
        conn.set_timer(lim.header_timeout)

    # ---- bytes in --------------------------------------------------------------------
    def on_data(self, conn, data: bytes) -> None:
        self.parser.feed(data)
        self._serve_ready()
        if conn.closed:
            return
        # waiting again: for the rest of a head (its clock runs from the
        # first of its bytes: not re-armed by the next ones), or idle
        if self.parser.head_started:
            if not self._head_clock:
                self._head_clock = True
                conn.set_timer(self.limits.header_timeout)
        else:
            self._head_clock = False
            conn.set_timer(self.limits.keepalive_timeout or None)

    def on_timeout(self, conn) -> None:
        if self.parser.head_started:
            self._refuse(408, "the request head did not arrive in time")
        else:
            conn.close()                       # idle keep-alive: nothing to say

    def on_eof(self, conn) -> None:
        conn.close()

    def _serve_ready(self) -> None:
        """Answers every complete request head buffered, in order."""
        while not self.conn.closed and not self._busy:
            try:
                env = self.parser.next_request(self.shared)
            except HttpError as exc:
                status, reason = exc.args
                self._refuse(status, reason)
                return
            if env is None:
                return
            env["SERVER_NAME"], env["SERVER_PORT"], env["REMOTE_ADDR"], env["REMOTE_PORT"] = \
                self.addr
            self._busy = True
            try:
                keep = self._serve(env)
            finally:
                self._busy = False
            if not keep:
                self.conn.close()
                return

    # ---- the body, for wsgi.input ----------------------------------------------------
    def _body_chunk(self, size: int = -1) -> bytes:
        if self._unread:
            take = self._unread if size < 0 else self._unread[:size]
            self._unread = self._unread[len(take):]
            return take
        while True:
            try:
                chunk = self.parser.read_body(size)
            except HttpError as exc:
                raise BadBody(*exc.args) from None
            if chunk or self.parser.body_done:
                return chunk
            if self._continue_due:
                self._continue_due = False
                if self._resp is not None and self._resp.started:
                    # answered without the body: the client still waits for
                    # the 100 and may never send it; this connection ends
                    raise ClientGone("the response went out before the body was asked for")
                self._send_raw(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._recv_more()

    def _body_peekline(self, size: int) -> bytes:
        chunk = self._body_chunk(size)
        nl = chunk.find(b"\n")
        if nl >= 0 and nl + 1 < len(chunk):
            self._unread = chunk[nl + 1:] + self._unread
            chunk = chunk[:nl + 1]
        return chunk

    def _recv_more(self) -> None:
        """Waits for body bytes on the socket (the loop thread is the app's
        while it runs) and feeds them to the parser. The body has a deadline
        of its own, not an idle timer: body_timeout from its first wait,
        extended by one second per MIN_BODY_RATE bytes received, so a
        client trickling a byte at a time cannot hold the thread (review)."""
        fd = self.conn.fd
        if self._body_deadline is None:
            self._body_deadline = time.monotonic() + self.limits.body_timeout
        while True:
            try:
                wait_ready(fd, select.POLLIN, self._body_deadline,
                           "timed out waiting for the request body")
            except TimeoutError as exc:
                raise ClientGone(str(exc)) from None
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise ClientGone(str(exc)) from None
            if not data:
                raise ClientGone("the client closed the connection mid-body")
            self._body_deadline += len(data) / MIN_BODY_RATE
            self.parser.feed(data)
            return

    # ---- one request -----------------------------------------------------------------
    def _serve(self, env: dict) -> bool:
        """Runs the app for env and writes its response; True if the
        connection may serve another request."""
        parser = self.parser
        # what already arrived of the body is checked before the app runs: a
        # framing error there is a 400 and the app never sees the request
        try:
            parser.read_body(0)
        except HttpError:
            pass
        if parser.error is not None:
            self._refuse(*parser.error)
            return False
        env["wsgi.input"] = Input(self)
        # RFC 9110 10.1.1: an HTTP/1.0 client's expectation is ignored
        self._continue_due = parser.expect_continue and env["SERVER_PROTOCOL"] == "HTTP/1.1"
        self._body_deadline = None
        self._unread = b""
        keep = parser.keep_alive and not self.conn.loop.draining     # then: Connection: close
        head_only = env["REQUEST_METHOD"] == "HEAD"
        resp = self._resp = _Response(self, env["SERVER_PROTOCOL"], keep, head_only)
        result = None
        started = time.monotonic()
        try:
            result = self.app(env, resp.start_response)
            if isinstance(result, FileWrapper) and (ffd := result.regular_fd()) >= 0 \
                    and not resp._pending:
                self._sendfile(resp, result, ffd)
            else:
                for chunk in result:
                    if chunk:
                        resp.write(chunk)
                resp.finish()
        except ClientGone as exc:
            log.debug("%s %s: %s", env["REQUEST_METHOD"], env["RAW_URI"], exc)
            return False
        except BadBody as exc:
            if not resp.headers_sent:
                self._refuse(*exc.args)          # the app let it through: ours to say
            return False
        except Exception:
            log.exception("app failed on %s %s", env["REQUEST_METHOD"], env["RAW_URI"])
            if resp.headers_sent:
                return False                   # the response is cut: close
            resp = _Response(self, env["SERVER_PROTOCOL"], False, head_only)
            body = b"Internal Server Error\n"
            resp.start_response("500 Internal Server Error",
                                [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
            resp.write(body)
            resp.finish()
            return False
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:
                    log.exception("close() of the app's response failed")
            if self.limits.access is not None:
                self.limits.access(env, resp.status, resp.sent, started)
        self._resp = None
        if self._continue_due:
            return False                 # the client never got its 100: do not wait for a body
        # the body must be consumed before the next request: drain what
        # the app left unread (bounded by the body limit and timeout)
        try:
            while self._body_chunk():
                pass
        except (ClientGone, BadBody):
            return False                         # answered already: just close
        return resp.keep and parser.finish()

    def _sendfile(self, resp: "_Response", wrapper: FileWrapper, ffd: int) -> None:
        """The response body from a regular file, by sendfile(2), from the
        file's current position to its end (or the app's Content-Length)."""
        if resp.status is None:
            raise AssertionError("the app returned without calling start_response")
        offset = wrapper.filelike.tell() if hasattr(wrapper.filelike, "tell") else 0
        count = max(0, os.fstat(ffd).st_size - offset)
        if resp.length is not None:
            count = min(count, resp.length)
        resp.headers_sent = True
        conn, timeout = self.conn, self.limits.body_timeout
        conn.write(resp._head(count))
        if resp.head_only or not count:
            return
        try:
            conn.flush_now(timeout)              # the head first, in order
            deadline = time.monotonic() + timeout
            while count:
                try:
                    n = os.sendfile(conn.fd, ffd, offset, count)
                except BlockingIOError:
                    wait_ready(conn.fd, select.POLLOUT, deadline, "the client does not read")
                    continue
                if n == 0:
                    break                        # the file shrank under us
                offset += n
                count -= n
                resp.sent += n
                deadline = time.monotonic() + timeout
        except (TimeoutError, OSError) as exc:
            raise ClientGone(str(exc)) from None
        if count:
            resp.keep = False                    # fewer bytes than announced: close

    def _refuse(self, status: int, reason: str) -> None:
        body = f"{status} {REASONS.get(status, 'Error')}: {reason}\n".encode("latin-1", "replace")
        head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
                f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n").encode("latin-1")
        self.conn.write(head + body)
        self.conn.close()

    def _send_raw(self, data: bytes) -> None:
        self.conn.write(data)


class _Response:
    """start_response, write() and the framing of one response."""

    def __init__(self, owner: WSGIConnection, protocol: str, keep: bool, head_only: bool):
        self.owner = owner
        self.http11 = protocol == "HTTP/1.1"
        self.keep = keep
        self.head_only = head_only
        self.status: str | None = None
        self.prefix = b""                  # status line and the app's headers, serialised
        self.headers_sent = False
        self.length: int | None = None     # Content-Length the app set
        self.chunked = False
        self.sent = 0
        self.started = False               # body bytes given (held or sent): too late for exc_info
        self.bodiless = False              # 1xx, 204, 304: no body goes out, whatever the app gives
        self._pending: list[bytes] = []    # the first chunk, held to learn the length

    def start_response(self, status: str, headers: list, exc_info=None):
        if exc_info is not None:
            try:
                if self.started:       # PEP 3333: too late to change the status
                    raise exc_info[1].with_traceback(exc_info[2])
            finally:
                exc_info = None
        elif self.status is not None:
            raise AssertionError("start_response called twice without exc_info")
        # checked and serialised in C: status, token names, values without
        # CTL, one Content-Length in digits; hop-by-hop headers dropped
        self.prefix, length, close = response_head(status, headers)
        if close:
            self.keep = False
        code = int(status[:3])
        self.bodiless = 100 <= code < 200 or code in (204, 304)
        self.length = None if length < 0 else length
        self.status = status
        return self.write

    def _head(self, body_known: int | None) -> bytes:
        head = [self.prefix, _date(), self.owner.limits.server_line]
        if self.bodiless:
            body_known = None                  # nothing to count: no body goes out
        if self.length is None and body_known is not None:
            self.length = body_known
            head.append(b"Content-Length: %d\r\n" % body_known)
        if self.length is None and not self.head_only and not self.bodiless:
            if self.http11:
                self.chunked = True
                head.append(b"Transfer-Encoding: chunked\r\n")
            else:
                self.keep = False              # HTTP/1.0, length unknown: close ends it
        if not self.keep:
            head.append(b"Connection: close\r\n")
        elif not self.http11:
            head.append(b"Connection: keep-alive\r\n")
        head.append(b"\r\n")
        return b"".join(head)

    def write(self, data: bytes) -> None:
        if self.status is None:
            raise AssertionError("write() before start_response")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"response body chunks must be bytes, not {type(data).__name__}")
        if data:
            self.started = True
        if not self.headers_sent and not self._pending:
            self._pending.append(bytes(data))  # the first chunk: maybe the whole body
            return
        self._flush_pending(None)
        self._send(data)

    def _flush_pending(self, known: int | None) -> None:
        if self.headers_sent:
            return
        self.headers_sent = True
        first = b"".join(self._pending)
        self._pending = []
        # the head and the first chunk in one write (one segment, one syscall)
        self._send(first, self._head(known))

    def _send(self, data, head: bytes = b"") -> None:
        conn = self.owner.conn
        if conn.closed:
            raise ClientGone("the client went away")
        if self.head_only or self.bodiless or not data:
            if head:
                conn.write(head)
            return
        if self.length is not None and self.sent + len(data) > self.length:
            data = bytes(data)[:self.length - self.sent]   # never past what we announced
            self.keep = False
        self.sent += len(data)
        if self.chunked:
            conn.write(b"%s%x\r\n%s\r\n" % (head, len(data), data))
        else:
            conn.write(head + bytes(data) if head else bytes(data))
        if conn.pending > HIGH_WATER:
            # a client that does not read: the app waits, the buffer stays
            # bounded (a reset or a stall past body_timeout ends it)
            try:
                conn.flush_now(self.owner.limits.body_timeout, below=LOW_WATER)
            except (TimeoutError, OSError) as exc:
                raise ClientGone(str(exc)) from None

    def finish(self) -> None:
        if self.status is None:
            raise AssertionError("the app returned without calling start_response")
        if not self.headers_sent:
            # the whole body was one chunk (or none): its length is known
            self._flush_pending(sum(len(p) for p in self._pending))
        if self.chunked:
            self.owner.conn.write(b"0\r\n\r\n")
        if self.length is not None and self.sent < self.length and not self.head_only:
            self.keep = False                  # the app sent less than it announced


_DATE = [0, b""]


def _date() -> bytes:
    """The Date header line, formatted once a second (formatdate costs
    microseconds, a hello response's whole budget is a few)."""
    now = int(time.time())
    if _DATE[0] != now:
        _DATE[0], _DATE[1] = now, b"Date: %s\r\n" % formatdate(now, usegmt=True).encode()
    return _DATE[1]


def _addresses(conn) -> tuple[str, str, str, str]:
    """SERVER_NAME, SERVER_PORT, REMOTE_ADDR, REMOTE_PORT of a connection."""
    local, peer = conn.local, conn.peer
    if isinstance(local, tuple):
        return str(local[0]), str(local[1]), str(peer[0]), str(peer[1])
    return str(local or ""), "", "", ""          # a unix socket


def _shared_environ(loop, lim: _Limits) -> dict:
    """The keys every request of the worker shares (its connections' own
    four are set per request)."""
    return {
        "SCRIPT_NAME": lim.root_path,
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": lim.multithread,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        "wsgi.input_terminated": True,
        "wsgi.file_wrapper": FileWrapper,
        "sockherd.loop": loop,                  # the worker's loop (the status page reads it)
    }
