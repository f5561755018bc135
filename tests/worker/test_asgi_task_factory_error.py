"""A task factory that raises (issue 35 point 12): the app set one
(loop.set_task_factory) and it raised when the request's task was made.
The coroutine that was never run is closed (no "never awaited" warning),
but coro.close() ran with the factory's exception still set and wiped it:
the log said `NoneType: None` where the factory's error belonged. The
exception is kept across the close: the log has the factory's own
exception and traceback, the connection is closed (a handler error the
engine contains) and the loop thread serves on.

A real Loop over a real fdcore Table on loopback (conftest.py's
serve_asgi)."""
from __future__ import annotations

import asyncio
import logging

import pytest

from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(60)


class FactoryBoom(Exception):
    """The app's task factory's own error."""


def make_app():
    left = {"fail": 0}

    def factory(loop, coro, **kw):
        if left["fail"]:
            left["fail"] -= 1
            raise FactoryBoom("the factory refused this task")
        return asyncio.Task(coro, loop=loop, **kw)

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["path"] == "/arm":
            asyncio.get_running_loop().set_task_factory(factory)
            left["fail"] = 1                  # the next request's task
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
    return app


def get(path: bytes) -> bytes:
    return b"GET " + path + b" HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"


def test_a_task_factory_error_is_logged_as_itself(serve_asgi, caplog):
    _, addr = serve_asgi(make_app())
    assert raw(addr, get(b"/arm")).endswith(b"\r\n\r\nok")
    with caplog.at_level(logging.ERROR, logger="sockherd.worker"):
        out = raw(addr, get(b"/refused"))
        # no task, so no app to answer for: the engine closes the
        # connection (a contained handler error), as before
        assert out == b"" or out.startswith(b"HTTP/1.1 500"), out
        assert raw(addr, get(b"/after")).endswith(b"\r\n\r\nok")
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    text = "\n".join(r.getMessage() + "\n" + (r.exc_text or "") for r in errors)
    assert any(r.exc_info and r.exc_info[0] is FactoryBoom for r in errors), text
    assert "the factory refused this task" in text and "NoneType: None" not in text, text
