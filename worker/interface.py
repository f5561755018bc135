"""Which interface an app speaks: ASGI 3, WSGI or stream, found from the object.

`sockherd run pkg:app` with `interface = auto` (the default) serves what it
finds here; an explicit `--interface` is checked against it. The worker logs
the choice and why (`interface: asgi (coroutine function)`), and `sockherd
check` prints the same.

What can be known without calling the app:

- ASGI 3 is an async callable taking (scope, receive, send): a coroutine
  function (also behind functools.partial, or marked with
  inspect.markcoroutinefunction / asgiref's markcoroutinefunction, as Django's
  handlers are), or an object whose `__call__` is one (Starlette, FastAPI,
  Django's ASGIHandler), or a class whose instances are awaitable (made from
  the three arguments, then awaited).
- stream is a handler class: the loop makes one per connection, and on_data
  is the only method it must have (worker/stream.py).
- ASGI 2 ("double callable": the app called with the scope returns an async
  callable taking receive and send) is a class whose `__call__` is async, or
  a plain callable of one argument. It is wrapped into ASGI 3, as uvicorn
  does: nothing is lost and the app keeps working.
- WSGI is what remains: a plain callable (environ, start_response), or a
  class PEP 3333 style.

Some answers are certain (a coroutine function is no WSGI app) and some are
guesses (a class without on_data may be a WSGI app class or something else).
An explicit `--interface` that contradicts a certain answer is refused with
what was found; one that meets a guess wins. A plain function of three
arguments that is not a coroutine function is the one case `auto` refuses:
it may return an awaitable (ASGI 3) or not, and only its author knows.
"""
from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass


class InterfaceError(Exception):
    """The app cannot be served with the interface asked for, or auto cannot tell."""


@dataclass(frozen=True)
class Chosen:
    kind: str          # "asgi", "wsgi" or "stream"
    app: object        # what to serve: the app, or an ASGI 2 app wrapped as ASGI 3
    why: str           # what was found, for the start log line and `sockherd check`

    def __str__(self) -> str:
        return f"{self.kind} ({self.why})"


@dataclass(frozen=True)
class _Found:
    kind: str | None   # "asgi", "asgi2", "wsgi", "stream"; None: cannot tell
    why: str
    certain: bool


def is_coroutine_function(fn) -> bool:
    """inspect's test (partials unwrapped; markcoroutinefunction's mark from
    3.12 on), and before 3.14 asyncio's too: asgiref marks Django's handlers
    for it on Pythons without inspect.markcoroutinefunction (3.11). Only
    where asyncio is imported already (asgiref imports it; no mark exists
    otherwise): a WSGI worker does not pay for importing it."""
    if inspect.iscoroutinefunction(fn):
        return True
    aio = sys.modules.get("asyncio")
    # asyncio.iscoroutinefunction warns from 3.14 on, where inspect's mark is the only one
    return aio is not None and sys.version_info < (3, 14) and aio.iscoroutinefunction(fn)


def _required_positional(fn) -> int | None:
    """How many positional arguments fn must be given (None: unknown, or
    *args takes any number)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):          # a builtin or C callable without one
        return None
    count = 0
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            return None
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
            count += 1
    return count


def _find(app) -> _Found:
    if inspect.isclass(app):
        if callable(getattr(app, "on_data", None)):
            return _Found("stream", "a handler class with on_data", True)
        if hasattr(app, "__await__"):
            return _Found("asgi", "a class of awaitable instances", True)
        if is_coroutine_function(getattr(app, "__call__", None)):
            return _Found("asgi2", "an ASGI 2 class: its instances' __call__ is a coroutine "
                          "function", True)
        return _Found("wsgi", "a class, not a stream handler (no on_data) nor async", False)
    if is_coroutine_function(app):
        what = "a functools.partial of a coroutine function" \
            if isinstance(app, functools.partial) else "a coroutine function"
        return _Found("asgi", what, True)
    if not inspect.isroutine(app) and not isinstance(app, functools.partial) \
            and is_coroutine_function(getattr(app, "__call__", None)):
        return _Found("asgi", f"an object ({type(app).__name__}) whose __call__ is a "
                      "coroutine function", True)
    try:
        inner = inspect.unwrap(app)
    except ValueError:                       # a __wrapped__ cycle: nothing to learn there
        inner = app
    if is_coroutine_function(inner):
        # a decorator's sync wrapper (functools.wraps) around an async app:
        # it returns the coroutine, or it would not be put in front of one
        return _Found("asgi", "a wrapper of a coroutine function", False)
    n = _required_positional(app)
    if n == 1:
        return _Found("asgi2", "a callable of one argument: ASGI 2 (scope -> async callable)",
                      False)
    if n == 3:
        return _Found(None, "a callable of three arguments that is not a coroutine function",
                      False)
    if n == 2:
        return _Found("wsgi", "a plain callable of two arguments", True)
    return _Found("wsgi", "a plain callable", False)


def _wrap_asgi2(app):
    """An ASGI 2 app as ASGI 3 (uvicorn's ASGI2Middleware idea): the scope
    makes the instance, which is then awaited with receive and send."""
    async def asgi3(scope, receive, send):
        instance = app(scope)
        await instance(receive, send)
    asgi3.__qualname__ = f"asgi2({getattr(app, '__qualname__', type(app).__name__)})"
    return asgi3


def choose(app, interface: str = "auto", spec: str = "the app") -> Chosen:
    """The interface to serve `app` with: `interface` is the setting (auto,
    asgi, wsgi or stream). Raises InterfaceError with what was found."""
    found = _find(app)
    kind = "asgi" if found.kind == "asgi2" else found.kind
    if interface == "auto":
        if kind is None:
            raise InterfaceError(
                f"{spec} is {found.why}: it may be ASGI 3 (if it returns an awaitable) or "
                f"not; say which with --interface asgi or --interface wsgi")
        wrapped = found.kind == "asgi2"
        return Chosen(kind, _wrap_asgi2(app) if wrapped else app,
                      found.why + (", wrapped as ASGI 3" if wrapped else ""))
    if kind is not None and kind != interface and found.certain:
        raise InterfaceError(
            f"--interface {interface}, but {spec} is {found.why}: that is the {kind} interface "
            f"(set --interface {kind}, or auto)")
    if interface == "stream" and not (inspect.isclass(app) and
                                      callable(getattr(app, "on_data", None))):
        raise InterfaceError(f"--interface stream, but {spec} is not a handler class with an "
                             f"on_data method (worker/stream.py): {found.why}")
    if interface == "asgi" and found.kind == "asgi2":
        return Chosen("asgi", _wrap_asgi2(app), found.why + ", wrapped as ASGI 3 (--interface)")
    return Chosen(interface, app, f"--interface {interface}; found {found.why}")
