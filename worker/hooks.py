"""Server hooks: functions of the operator's, named as gunicorn's, called
at points of a master's or a worker's life (the `hooks` setting names where
they are: a module, or a `.py` file such as the `-c` config itself).

What we pass (gunicorn passes its Arbiter and Worker objects; configs use a
few of their attributes, which these views have):

  on_starting(server)   master, before the listeners are bound; raising stops
                        the start (the traceback printed, exit status 1)
  when_ready(server)    master, once every worker of the first generation is READY
  on_reload(server)     master, at each reload (HUP, `ctl reload`), before the
                        settings are read again
  on_exit(server)       master, as it exits
  child_exit(server, worker)   master, after a worker exited (worker.pid, .exitcode)
  post_worker_init(worker)     each worker, after the app is imported, before
                        READY; raising means the worker never becomes READY
                        (its start fails; a reload is refused)
  worker_exit(server, worker)  each worker, once it stopped serving
  pre_request(worker, req)     each worker, before the app is called
  post_request(worker, req, environ, resp)  each worker, after the response
                        (resp.status, resp.status_code, resp.headers)

server: .pid, .log (a logging.Logger), .cfg (the settings). worker: .pid,
.ppid, .log, .cfg, .wsgi (the app), .generation, .index (.age: the index).
req: .method, .path, .query, .uri, .version, .headers (gunicorn's: upper-case
names), .environ (WSGI) or .scope (ASGI).

A hook's exception other than on_starting's and post_worker_init's is logged
with its traceback and changes nothing else: serving goes on. The request
hooks wrap the app only when one of them is defined: an app without them is
called directly, at no cost.
"""
from __future__ import annotations

import importlib
import logging
import os
import runpy
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("sockherd.hooks")

NAMES = ("on_starting", "when_ready", "on_reload", "on_exit", "post_worker_init",
         "worker_exit", "child_exit", "pre_request", "post_request")


class HooksError(Exception):
    """The hooks source cannot be loaded (the cause chained)."""


class Hooks:
    def __init__(self, funcs: dict[str, Callable] | None = None, source: str = ""):
        self.source = source
        self.funcs = {n: f for n, f in (funcs or {}).items() if n in NAMES and callable(f)}

    def __bool__(self) -> bool:
        return bool(self.funcs)

    def has(self, name: str) -> bool:
        return name in self.funcs

    def run(self, name: str, *args) -> None:
        """Calls hook `name` if defined; its exception propagates (the
        hooks whose failure stops something)."""
        f = self.funcs.get(name)
        if f is not None:
            f(*args)

    def call(self, name: str, *args) -> bool:
        """Calls hook `name` if defined; an exception is logged with its
        traceback and swallowed. False if it raised."""
        f = self.funcs.get(name)
        if f is None:
            return True
        try:
            f(*args)
        except Exception:                 # noqa: BLE001 - the operator's code: logged, contained
            log.exception("hook %s (%s) failed; serving goes on", name, self.source)
            return False
        return True


def load(spec: str, *, chdir: str = "", pythonpath: list[str] | tuple = ()) -> Hooks:
    """The hooks of `spec`: a path to a .py file (run, as a config is) or a
    dotted module name (imported with chdir and pythonpath first on
    sys.path, as the app is). Empty: no hooks. Raises HooksError."""
    if not spec:
        return Hooks()
    if spec.endswith(".py"):
        path = spec if os.path.isabs(spec) or not chdir else os.path.join(chdir, spec)
        try:
            ns = runpy.run_path(path, run_name="__config__")
        except BaseException as exc:      # noqa: BLE001 - the file's own code
            raise HooksError(f"hooks {spec!r}: running it raised {exc!r}") from exc
        return Hooks(ns, spec)
    import sys

    base = chdir or os.getcwd()
    for entry in reversed([*pythonpath, base]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        module = importlib.import_module(spec)
    except BaseException as exc:          # noqa: BLE001 - the module's own code
        raise HooksError(f"hooks {spec!r}: importing it raised {exc!r}") from exc
    return Hooks(vars(module), spec)


# ---- what the hooks are given -----------------------------------------------------------

@dataclass
class Server:
    """gunicorn's Arbiter as hooks use it."""
    pid: int
    cfg: Any
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("sockherd.master"))


@dataclass
class Worker:
    """gunicorn's Worker as hooks use it (in the worker, or in the master's
    child_exit: there .wsgi is None and .exitcode says how it ended)."""
    pid: int
    ppid: int
    cfg: Any
    generation: int
    index: int
    wsgi: Any = None
    exitcode: int | None = None
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("sockherd.worker"))

    @property
    def age(self) -> int:
        return self.index


class Request:
    """The request as pre_request/post_request see it (gunicorn's Request
    attributes), read from the environ or the ASGI scope on demand."""

    def __init__(self, environ: dict | None = None, scope: dict | None = None):
        self.environ = environ
        self.scope = scope

    @property
    def method(self) -> str:
        return self.environ.get("REQUEST_METHOD", "") if self.environ is not None \
            else self.scope.get("method", "")

    @property
    def path(self) -> str:
        if self.environ is not None:
            return self.environ.get("SCRIPT_NAME", "") + self.environ.get("PATH_INFO", "")
        return self.scope.get("root_path", "") + self.scope.get("path", "")

    @property
    def query(self) -> str:
        if self.environ is not None:
            return self.environ.get("QUERY_STRING", "")
        return self.scope.get("query_string", b"").decode("latin-1")

    @property
    def uri(self) -> str:
        return self.path + (f"?{self.query}" if self.query else "")

    @property
    def version(self) -> tuple[int, int]:
        text = self.environ.get("SERVER_PROTOCOL", "HTTP/1.1")[5:] if self.environ is not None \
            else self.scope.get("http_version", "1.1")
        major, _, minor = text.partition(".")
        return int(major or 1), int(minor or 0)

    @property
    def headers(self) -> list[tuple[str, str]]:
        if self.environ is not None:
            out = [(k[5:].replace("_", "-"), v) for k, v in self.environ.items()
                   if k.startswith("HTTP_")]
            for k in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                if k in self.environ:
                    out.append((k.replace("_", "-"), self.environ[k]))
            return out
        return [(k.decode("latin-1").upper(), v.decode("latin-1"))
                for k, v in self.scope.get("headers", ())]


class Response:
    """What post_request sees of the response."""

    def __init__(self):
        self.status: str | None = None
        self.headers: list = []

    @property
    def status_code(self) -> int | None:
        return int(self.status.split(None, 1)[0]) if self.status else None


# ---- pre_request / post_request: the app wrapped, only when one is defined ---------------

class _Closing:
    """The app's response iterable, with post_request run once it is closed
    (the engine closes it after the last byte, as PEP 3333 asks, or on an
    error)."""

    def __init__(self, result, done: Callable[[], None]):
        self._result = result
        self._done = done

    def __iter__(self):
        return iter(self._result)

    def close(self) -> None:
        try:
            close = getattr(self._result, "close", None)
            if close is not None:
                close()
        finally:
            done, self._done = self._done, None
            if done is not None:
                done()


def wrap_wsgi(app, hooks: Hooks, worker: Worker):
    """app, or app with pre_request/post_request around each call."""
    if not (hooks.has("pre_request") or hooks.has("post_request")):
        return app

    def hooked(environ, start_response):
        req = Request(environ=environ)
        hooks.call("pre_request", worker, req)
        resp = Response()

        def seen(status, headers, exc_info=None):
            resp.status, resp.headers = status, headers
            return start_response(status, headers, exc_info)

        def done():
            hooks.call("post_request", worker, req, environ, resp)

        try:
            result = app(environ, seen)
        except BaseException:
            done()
            raise
        return _Closing(result, done)

    return hooked


def wrap_asgi(app, hooks: Hooks, worker: Worker):
    """An ASGI 3 app, or it with pre_request/post_request around each HTTP
    request (WebSocket and lifespan scopes pass as they are)."""
    if not (hooks.has("pre_request") or hooks.has("post_request")):
        return app

    async def hooked(scope, receive, send):
        if scope.get("type") != "http":
            return await app(scope, receive, send)
        req = Request(scope=scope)
        hooks.call("pre_request", worker, req)
        resp = Response()

        async def seen(message):
            if message.get("type") == "http.response.start":
                resp.status = str(message.get("status", ""))
                resp.headers = [(k.decode("latin-1"), v.decode("latin-1"))
                                for k, v in message.get("headers", ())]
            await send(message)

        try:
            return await app(scope, receive, seen)
        finally:
            hooks.call("post_request", worker, req, scope, resp)

    return hooked
