"""The `wsgi` interface (PEP 3333): the Python side of the native engine.

The request path is native (worker/native, one Server per worker): the
loop turn, reading, parsing (llhttp, strict), environ, start_response, the
framing and the writes, and the header and keep-alive timers. What stays
here is what is rare or policy:

  - the slow path (serve_slow): a request whose body is still arriving
    and is larger than `body_buffer` (a smaller one is read whole by the
    engine, in the loop, before the app runs), or that waits for a
    `100 Continue` with such a body. The app runs in the loop thread that
    owns the connection, and `wsgi.input` reads the body straight from the
    socket (waiting for it with poll, bounded by `body_timeout` and a
    minimum rate), so a large upload is never held whole in memory; the
    100 Continue goes out when the app first reads;
  - `wsgi.file_wrapper`: a regular file is sent with sendfile(2);
  - the logging of an app's exception (the access log: accesslog.py);
  - the settings (_Limits) and the environ keys every request shares.

A request whose body is all here (or that has none: most of them) never
reaches this module: its wsgi.input is a BytesIO of the body.
"""
from __future__ import annotations

import functools
import io
import logging
import os
import select
import stat
import sys
import threading
import time

from sockherd.worker import forwarded
from sockherd.worker._http import BadBody, ClientGone, HttpError, Server  # noqa: F401
from sockherd.worker.accesslog import access_log
from sockherd.master.tls import engine_args as tls_args
from sockherd.worker.proxy import DEFAULT_ALLOW, Policy, log_closed
from sockherd.worker.fdwait import wait_ready

log = logging.getLogger("sockherd.worker")


# bytes/s a request body must average past body_timeout (the slow path's
# and the engine's, for a body it reads before the app runs)
MIN_BODY_RATE = 64 << 10


class _Limits:
    def __init__(self, cfg: dict):
        # 0: gunicorn's "unlimited", here the settings' upper bound
        self.line = int(cfg.get("limit_request_line", 4094)) or 1 << 20
        self.field_size = int(cfg.get("limit_request_field_size", 8190)) or 1 << 20
        self.headers = int(cfg.get("limit_request_fields", 100)) or 32768
        self.body = int(cfg.get("limit_request_body", 0))
        self.body_timeout = float(cfg.get("body_timeout", 30.0))
        self.body_buffer = int(cfg.get("body_buffer", 1 << 20))
        self.root_path = str(cfg.get("root_path", ""))
        self.server_header = str(cfg.get("server_header", ""))
        self.server_line = (b"Server: %s\r\n" % self.server_header.encode("latin-1")
                            if self.server_header else b"")
        self.access = access_log(cfg)
        self.header_timeout = float(cfg.get("header_timeout", 15.0))
        self.proxy = Policy(cfg.get("proxy_protocol", "off"),
                            cfg.get("proxy_allow_from", DEFAULT_ALLOW))
        self.keepalive_timeout = float(cfg.get("keepalive_timeout", 75.0))
        self.multithread = int(cfg.get("threads", 1)) > 1
        self.forwarded = forwarded.from_config(cfg)     # trusted proxies (worker/forwarded.py)
        self.timeout = float(cfg.get("timeout", 0.0))
        self.tls = tls_args(cfg)                        # TLS (worker/native/conn/conn_tls.c)


def make_handler(app, cfg: dict):
    """What the loop is given for the wsgi interface: a class whose
    make_engine(loop) builds the worker's native Server serving `app` with
    the settings cfg."""
    limits = _Limits(cfg)

    class Handler:
        @staticmethod
        def make_engine(loop):
            return make_engine(loop, app, limits)

    return Handler


def make_engine(loop, app, lim: "_Limits") -> Server:
    from sockherd.fdcore.table import Event
    from sockherd.worker.loop_core import KIND_CONN

    relief = loop.relief
    # several loop threads in a group: each connection is shared by them,
    # a request goes to an idle one (worker/native/engine/dispatch.c); the relief
    # (a watchdog that moves connections off a stuck thread) is not needed
    groups = [th.tgid for th in loop.loop_threads]
    dispatch = any(groups.count(g) > 1 for g in set(groups))
    if dispatch:
        relief.enabled = False
        # one connection an accept: the rest of a burst wakes other idle
        # threads (the listener is exclusive), each serving its own first
        loop.accept_batch = 1
    engine = Server(
        loop=loop, api=loop.table.c_api(),
        threads=[(th, th.address, th.tgid, th.bit) for th in loop.loop_threads],
        maxfd=loop.table.maxfd, kind_conn=KIND_CONN, app=app, base=_shared_environ(loop, lim),
        slow=functools.partial(serve_slow, lim), access=lim.access, report=_report,
        sendfile=functools.partial(sendfile_response, lim), file_wrapper=FileWrapper,
        bytes_io=io.BytesIO, no_body=NO_BODY, event_type=Event,
        # the relief's stamps only where there is a sibling to relieve, or
        # a request timeout to watch (worker/stuck.py)
        busy=relief.busy if relief.enabled or lim.timeout else None,
        enter_app=loop._enter_app if relief.enabled else None,
        limits=(lim.line, lim.field_size, lim.headers, lim.body), script_name=lim.root_path,
        server_line=lim.server_line, header_timeout=lim.header_timeout,
        keepalive_timeout=lim.keepalive_timeout, body_timeout=lim.body_timeout,
        body_buffer=lim.body_buffer, min_body_rate=MIN_BODY_RATE,
        ws_ping_interval=0.0, ws_ping_timeout=0.0)       # no WebSockets in WSGI
    connection_layer(engine, lim)
    engine.dispatch = dispatch
    return engine


def connection_layer(engine: Server, lim: "_Limits") -> None:
    """The engine's connection-layer settings, whatever its interface
    (this one, worker/asgi.py): the refusal log, the trusted proxies whose
    forwarding fields are believed (worker/forwarded.py), TLS and the
    PROXY protocol header expected (worker/proxy.py)."""
    engine.log_refusals(_log_refusal)
    forwarded.install(engine, lim.forwarded)
    if lim.tls:
        engine.set_tls(**lim.tls)          # ValueError naming the file: never READY
        # the engine holds its context and ratchets its own copy of the
        # ticket secret: the key's bytes and the spawn's secret go (one
        # engine a worker: make_engine runs once)
        lim.tls = None
    if lim.proxy.on:
        allow = lim.proxy.allow
        engine.set_proxy(lim.proxy.mode, allow.packed(), allow.all, allow.unix)


def _log_refusal(peer, status: int, reason: str, count: int) -> None:
    """A request the engine refused (called at most once a second per
    worker: count is how many since the last line, this one included)."""
    if status == 0:                  # a connection closed over its PROXY header
        log_closed(peer, reason, count)
        return
    who = "%s:%s" % peer if isinstance(peer, tuple) else (peer or "unix socket")
    more = f" ({count} refused since the last line)" if count > 1 else ""
    log.warning("refused %d from %s: %s%s", status, who, reason, more)


def _report(env, what: str) -> None:
    """Logs the exception being handled (set by the engine)."""
    if what == "app" and env is not None:
        # .get: the app may have emptied its environ (its error still logged)
        log.exception("app failed on %s %s", env.get("REQUEST_METHOD"), env.get("RAW_URI"))
    else:
        log.exception("%s failed", what)


class Input:
    """wsgi.input: the current request's body, read on demand from the
    parser's buffer and, when that is empty, from the socket itself."""

    def __init__(self, owner: "_Streaming"):
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


class _NoBody:
    """wsgi.input of a request without a body: one shared object that
    holds nothing and cannot be written to (PEP 3333's four methods)."""

    __slots__ = ()

    def read(self, size: int | None = -1) -> bytes:
        return b""

    def readline(self, size: int | None = -1) -> bytes:
        return b""

    def readlines(self, hint: int = -1) -> list[bytes]:
        return []

    def __iter__(self):
        return iter(())


NO_BODY = _NoBody()


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
        """The file's descriptor if it is a regular file with a size, else
        -1. A size of 0 is iterated: procfs and sysfs files say 0 and hold
        content, which sendfile, sized by st_size, sent as an empty body
        (review); an empty file iterates to nothing just as well."""
        try:
            fd = self.filelike.fileno()
            st = os.fstat(fd)
            return fd if stat.S_ISREG(st.st_mode) and st.st_size > 0 else -1
        except (AttributeError, OSError, ValueError):
            return -1


class _Streaming:
    """The body of a request served on the slow path, for wsgi.input: read
    on demand from the parser's buffer and, when that is empty, from the
    socket itself."""

    __slots__ = ("conn", "parser", "limits", "_unread", "continue_due", "_deadline", "abandoned",
                 "over", "draining", "_reading", "_fed")

    def __init__(self, conn, limits: _Limits, continue_due: bool):
        self.conn = conn
        self.parser = conn.parser
        self.limits = limits
        self._unread = b""            # body bytes taken from the parser, not yet read
        self.continue_due = continue_due
        self._deadline = None
        self.abandoned = False            # a 100-continue body not asked for in time
        # the request ended: a wsgi.input kept by the app reads nothing more
        # (it waited body_timeout on the loop thread, polling an fd number
        # that may be another client's by then, and read that client's bytes)
        self.over = False
        # the app answered and left the body: what it sends no longer
        # buys time (serve_slow's drain has body_timeout at most)
        self.draining = False
        # one reader of the socket at a time: a thread of the app's may read
        # wsgi.input while the loop thread drains the body, and whoever lost
        # the race for the bytes waited body_timeout for bytes already fed
        # to the parser, or read the next request's into it unseen (review)
        self._reading = threading.Lock()
        self._fed = 0                     # feeds so far: a waiter sees another's

    def _body_chunk(self, size: int = -1) -> bytes:
        if self.abandoned or self.over:
            return b""
        if self._unread:
            take = self._unread if size < 0 else self._unread[:size]
            self._unread = self._unread[len(take):]
            return take
        while True:
            if self.over:                     # ended while this thread waited
                return b""
            try:
                chunk = self.parser.read_body(size)
            except HttpError as exc:
                raise BadBody(*exc.args) from None
            if chunk or self.parser.body_done:
                return chunk
            if self.continue_due:
                self.continue_due = False
                resp = self.conn.response
                if resp is not None and (resp.started or resp.headers_sent):
                    # answering without the body: no 100 now, the client
                    # may never send it; the app reads an empty body, its
                    # answer goes out and the connection ends (review)
                    self.abandoned = True
                    return b""
                self.conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")
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
        client trickling a byte at a time cannot hold the thread (review).
        What is framed already (a pipelined request's answer, this one's)
        goes out meanwhile: the client never waits for it on our wait."""
        conn = self.conn
        fd = conn.fd
        if self._deadline is None:
            self._deadline = time.monotonic() + self.limits.body_timeout
        seen = self._fed
        while not self._reading.acquire(timeout=0.05):
            # another thread reads: what is framed still goes out meanwhile
            # (its wait may be for input only), and its bytes are looked at
            if conn.pending:
                conn.flush()
            if self._fed != seen or self.over:
                return
            if time.monotonic() >= self._deadline:
                raise ClientGone("timed out waiting for the request body")
        try:
            if self._fed == seen:             # else another reader fed the parser: look there
                self._recv_locked(conn, fd)
        finally:
            self._reading.release()

    def _recv_locked(self, conn, fd: int) -> None:
        while True:
            if self.over:
                # the request ended while this (app's) thread waited: the
                # socket's bytes are the next request's, or another
                # client's if the number was reused
                return
            if conn.pending:
                conn.flush()
                if conn.closed:                  # the write failed: reset, EPIPE
                    raise ClientGone("the client went away")
            # TLS: the session may hold bytes the socket no longer has,
            # so its read comes before any wait (worker/native/conn/conn_tls.c)
            data = conn.recv(65536) if conn.tls else None
            if data is None:
                try:
                    wait_ready(fd, select.POLLIN | select.POLLOUT if conn.pending
                               else select.POLLIN, self._deadline,
                               "timed out waiting for the request body")
                except TimeoutError as exc:
                    raise ClientGone(str(exc)) from None
                if self.over:
                    return
                try:
                    data = conn.recv(65536) if conn.tls else os.read(fd, 65536)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    raise ClientGone(str(exc)) from None
                if data is None:
                    continue
            if not data:
                raise ClientGone("the client closed the connection mid-body")
            if not self.draining:
                self._deadline += len(data) / MIN_BODY_RATE
            self.parser.feed(data)
            self._fed += 1
            return


def serve_slow(limits: _Limits, conn, env: dict) -> bool:
    """A request whose body is still arriving (or owed a 100 Continue),
    called by the engine: runs the app with a streaming wsgi.input, then
    reads what the app left of the body. True if the connection may serve
    another request."""
    parser = conn.parser
    # RFC 9110 10.1.1: an HTTP/1.0 client's expectation is ignored
    body = _Streaming(conn, limits,
                      parser.expect_continue and env["SERVER_PROTOCOL"] == "HTTP/1.1")
    env["wsgi.input"] = Input(body)
    try:
        keep = conn.respond(env)
        if not keep or body.continue_due or body.abandoned:
            # closing anyway (or the client never got its 100): reading the
            # rest of an upload nobody wants would hold the thread for nothing
            return False
        # the body must be consumed before the next request: drain what
        # the app left unread, within body_timeout from now at most and
        # never extended by the bytes received (a client sending fast
        # enough kept the loop thread draining a body nobody reads, review)
        body.draining = True
        drain_by = time.monotonic() + limits.body_timeout
        body._deadline = drain_by if body._deadline is None else min(body._deadline, drain_by)
        try:
            while body._body_chunk():
                pass
        except (ClientGone, BadBody):
            return False                         # answered already: just close
        return keep and parser.finish()
    finally:
        body.over = True


def sendfile_response(limits: _Limits, conn, resp, wrapper: FileWrapper, ffd: int,
                      park: bool = False) -> tuple[int, int] | None:
    """The response body from a regular file, by sendfile(2), from the
    file's current position to its end (or the app's Content-Length);
    called by the engine for a FileWrapper the app returned. park: the
    engine's loop sends the file itself (it never waits for the client on
    a loop thread): the head goes into the output and (offset, count) of
    the span is returned. Else (the slow path) all of it is sent here."""
    offset = wrapper.filelike.tell() if hasattr(wrapper.filelike, "tell") else 0
    count = max(0, os.fstat(ffd).st_size - offset)
    if resp.length is not None:
        count = min(count, resp.length)
    resp.send_head(count)
    if resp.head_only or resp.bodiless or not count:
        return (offset, 0) if park else None
    if park:
        return offset, count
    timeout = limits.body_timeout
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
    return None


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
