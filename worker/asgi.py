"""The `asgi` interface (ASGI 3.0, HTTP, spec 2.4): the Python side of the
native engine's ASGI adapter (worker/native/asgi_*.c).

The request path is native as for WSGI: the loop turn, reading, parsing,
the scope, the receive and send callables and their messages, the
framing and the writes. Each request's app runs as a task of the asyncio
loop of the loop thread that serves its connection; that loop's I/O is
the thread's own fdcore poller (worker/aio.py). What stays here: the
settings, the scope keys every request shares, the access log and the
logging of an app's errors.

Extensions (worker/native/app/asgi/asgi_ext.c): http.response.pathsend (sendfile
from the loop) in every scope, http.response.trailers when the client
sent TE: trailers. WebSocket scopes are served too (worker/native/app/asgi/asgi_ws.c,
docs/websocket.md).
"""
from __future__ import annotations

import asyncio
import logging
import sys

from sockherd.worker._http import ClientDisconnected, Server, ws_settings  # noqa: F401
from sockherd.worker.accesslog import AccessLog
from sockherd.worker.wsgi import _Limits, connection_layer, MIN_BODY_RATE

log = logging.getLogger("sockherd.worker")

ASGI_VERSION = {"version": "3.0", "spec_version": "2.4"}


def make_handler(app, cfg: dict, state: dict | None = None):
    """What the loop is given for the asgi interface: a class whose
    make_engine(loop) builds the worker's native Server serving the ASGI
    `app` with the settings cfg. state: the lifespan state, shallow-copied
    into each request's scope["state"] (None: no "state" key)."""
    limits = _Limits(cfg)
    # issue 23: WebSockets (worker/native/app/asgi/asgi_ws.c): a message's bound
    ws_settings(int(cfg.get("ws_max_size", 16 << 20)),
                bool(cfg.get("ws_per_message_deflate", False)))

    # issue 35, point 27: an open WebSocket's keep-alive ping (asgi_ws_ping.c)
    ping = (float(cfg.get("ws_ping_interval", 20.0)), float(cfg.get("ws_ping_timeout", 20.0)))

    class Handler:
        @staticmethod
        def make_engine(loop):
            return make_engine(loop, app, limits, state, ping)

    return Handler


async def run_call(app, scope, receive, send, done):
    """One request's app, as its task runs it: done(exception or None) at
    its end (worker/native/app/asgi/asgi_app.c answers what is missing and logs).
    Every BaseException of the app ends here (SystemExit, KeyboardInterrupt
    included: a loop thread never ends for the app). A GeneratorExit is
    ours to let through only when this coroutine is being closed (its loop
    closes, or it is collected unfinished): then no task is stepping it.
    One raised while its task steps it is the app's own, answered as any
    other (review, finding 3: it was let through, and the request was
    never answered)."""
    try:
        await app(scope, receive, send)
    except GeneratorExit as exc:
        if _closing(sys._getframe()):
            raise
        done(exc)
    except BaseException as exc:  # noqa: BLE001 - contained, answered, logged
        done(exc)
    else:
        done(None)


def _closing(frame) -> bool:
    """Whether the coroutine of `frame` runs from its close(), not from
    its task's step: the task stepping (if any) is not the frame's."""
    try:
        task = asyncio.current_task()
    except RuntimeError:                  # no loop runs here at all
        return True
    return task is None or getattr(task.get_coro(), "cr_frame", None) is not frame


def make_engine(loop, app, lim: _Limits, state: dict | None,
                ping: tuple[float, float] = (20.0, 20.0)) -> Server:
    from sockherd.fdcore.table import Event
    from sockherd.worker.loop_core import KIND_CONN

    # a connection whose task runs is its thread's alone (asgi_app.c): no
    # per-request dispatch among a group's threads, and no relief moving
    # connections off a thread (a thread in asyncio is never stuck in a
    # handler: its app awaits instead)
    loop.relief.enabled = False
    # "https" per connection, for one with a TLS session (asgi_scope.c):
    # a plain listener may serve beside TLS ones (master/tls_binds.py)
    base = {"type": "http", "asgi": dict(ASGI_VERSION), "scheme": "http",
            "root_path": lim.root_path}
    if state is not None:
        base["state"] = state
    engine = Server(
        loop=loop, api=loop.table.c_api(),
        threads=[(th, th.address, th.tgid, th.bit) for th in loop.loop_threads],
        maxfd=loop.table.maxfd, kind_conn=KIND_CONN, app=app, base=base,
        slow=run_call,                        # an ASGI Server's runner of one call
        access=_ScopeAccessLog(lim.access) if lim.access else None, report=_report,
        sendfile=None, file_wrapper=None, bytes_io=None, no_body=None, event_type=Event,
        busy=None, enter_app=None,
        limits=(lim.line, lim.field_size, lim.headers, lim.body), script_name=lim.root_path,
        server_line=lim.server_line, header_timeout=lim.header_timeout,
        keepalive_timeout=lim.keepalive_timeout, body_timeout=lim.body_timeout,
        body_buffer=lim.body_buffer, min_body_rate=MIN_BODY_RATE,
        ws_ping_interval=ping[0], ws_ping_timeout=ping[1])
    engine.interface = "asgi"
    connection_layer(engine, lim)
    return engine


def _header(scope: dict, name: bytes) -> str:
    for key, value in scope.get("headers") or ():
        if key == name:
            return value.decode("latin-1")
    return "-"


class _ScopeAccessLog:
    """The access log's line for a scope: the same atoms as the WSGI one
    (accesslog.py), read from the scope; a response header ({name}o) prints
    '-' here."""

    def __init__(self, access: AccessLog):
        self.access = access
        self.every_header = "}i)" in access.fmt or "(u)" in access.fmt or access.json

    def __call__(self, scope: dict, status: int, sent: int, started: float) -> None:
        get = scope.get
        raw = get("raw_path") or b""
        query = get("query_string") or b""
        client = get("client")
        env = {
            "REQUEST_METHOD": get("method", "-"),
            "SERVER_PROTOCOL": f"HTTP/{get('http_version', '1.1')}",
            "RAW_URI": (raw + (b"?" + query if query else b"")).decode("latin-1"),
            "PATH_INFO": get("path", "-"),
            "QUERY_STRING": query.decode("latin-1"),
            "REMOTE_ADDR": client[0] if client else "-",
            "HTTP_REFERER": _header(scope, b"referer"),
            "HTTP_USER_AGENT": _header(scope, b"user-agent"),
        }
        if self.every_header:                   # {name}i, u: the WSGI names of them all
            for key, value in get("headers") or ():
                env.setdefault("HTTP_" + key.decode("latin-1").upper().replace("-", "_"),
                               value.decode("latin-1"))
        self.access(env, str(status) if status else None, sent, started)


def _report(scope, what: str) -> None:
    """Logs the exception being handled (set by the engine)."""
    if what == "app" and isinstance(scope, dict):
        # a websocket scope has no method: its type says what it was
        log.exception("app failed on %s %s", scope.get("method") or scope.get("type"),
                      scope.get("path"))
    else:
        log.exception("%s failed", what)
