"""What an ASGI app does wrong is contained at the call boundary (issue
22 §2, errors): it raises before http.response.start -> 500; after the
head went out -> the connection closes mid-body; it returns without a
whole response -> 500 or a cut; messages of the wrong type or order ->
an app error naming the message, logged, never a traceback to the client.
Any BaseException (SystemExit, KeyboardInterrupt, its own) never ends a
loop thread: each test runs on ONE loop thread and asks a plain request
after the bad one, and the fixture checks loop.errors."""
from __future__ import annotations

import logging
import socket
import threading

import pytest

from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(60)


class Custom(BaseException):
    """A BaseException of the app's own."""


BAD = b"GET /bad HTTP/1.1\r\nHost: h\r\n\r\n"


async def ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok " + scope["path"].encode()})


def routed(bad):
    async def app(scope, receive, send):
        if scope["path"] == "/bad":
            return await bad(scope, receive, send)
        return await ok(scope, receive, send)
    return app


def still_serves(addr) -> None:
    out = raw(addr, b"GET /ok HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", timeout=5)
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"ok /ok"), out


def is_500(out: bytes) -> bool:
    return (out.startswith(b"HTTP/1.1 500 Internal Server Error") and
            b"Connection: close" in out and out.endswith(b"\r\n\r\nInternal Server Error\n"))


def cut(out: bytes) -> bool:
    """The head and the first part, then the close, no end of the chunked body."""
    return out.startswith(b"HTTP/1.1 200 OK") and b"first" in out and \
        not out.endswith(b"0\r\n\r\n")


@pytest.mark.parametrize("exc", [ValueError, SystemExit, KeyboardInterrupt, Custom])
def test_raise_before_start_is_a_500(serve_asgi, exc, caplog):
    async def bad(scope, receive, send):
        raise exc("boom")

    _, addr = serve_asgi(routed(bad))
    with caplog.at_level(logging.ERROR, logger="sockherd.worker"):
        out = raw(addr, BAD)
    assert is_500(out) and b"boom" not in out and b"Traceback" not in out
    still_serves(addr)
    assert any("app failed on GET /bad" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("exc", [ValueError, SystemExit, Custom])
def test_raise_after_the_head_cuts_the_connection(serve_asgi, exc):
    async def bad(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        raise exc("boom")

    _, addr = serve_asgi(routed(bad))
    assert cut(raw(addr, BAD))
    still_serves(addr)


def test_raise_in_the_app_call_itself(serve_asgi):
    """A class whose __call__ is not a coroutine function raising at once,
    and an ASGI 2 app (a callable returning a callable): 500s."""
    class Raises:
        def __call__(self, scope, receive, send):
            raise KeyboardInterrupt

    def asgi2(scope):
        async def inner(receive, send):
            pass
        return inner

    for app in (Raises(), asgi2):
        _, addr = serve_asgi(app)
        assert is_500(raw(addr, BAD))


def test_return_without_a_response(serve_asgi, caplog):
    async def nothing(scope, receive, send):
        return None

    async def half(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})

    async def start_only(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    for bad, check in ((nothing, is_500), (half, cut), (start_only, is_500)):
        _, addr = serve_asgi(routed(bad))
        with caplog.at_level(logging.ERROR, logger="sockherd.worker"):
            assert check(raw(addr, BAD)), bad
        still_serves(addr)
    text = caplog.text
    assert "returned without sending http.response.start" in text
    assert "returned before its response ended" in text


@pytest.mark.parametrize("messages,says", [
    ([{"type": "http.response.body", "body": b"x"}], "http.response.body before"),
    ([{"type": "http.response.start", "status": 200},
      {"type": "http.response.start", "status": 200}], "sent twice"),
    ([{"type": "http.response.start", "status": "200"}], "status must be an int"),
    ([{"type": "http.response.start", "status": 99}], "not within 100-599"),
    ([{"type": "http.response.start", "status": True}], "status must be an int"),
    ([{"type": "http.response.start"}], "without a status"),
    ([{"type": "http.response.start", "status": 200, "headers": [("a", "b")]}],
     "pair of bytes"),
    ([{"type": "http.response.start", "status": 200, "headers": [(b"a b", b"c")]}],
     "is not a token"),
    ([{"type": "http.response.start", "status": 200, "headers": [(b"a", b"c\r\nx: y")]}],
     "control character"),
    ([{"type": "http.response.start", "status": 200, "headers": 5}], "headers must be"),
    ([{"type": "http.response.start", "status": 200},
      {"type": "http.response.body", "body": "str"}], "body must be bytes"),
    ([{"type": "websocket.send", "bytes": b""}], "not a message of an http scope"),
    ([{"status": 200}], "needs a 'type'"),
    (["http.response.start"], "takes a message dict"),
])
def test_wrong_messages_are_logged_naming_them(serve_asgi, caplog, messages, says):
    async def bad(scope, receive, send):
        for m in messages:
            await send(m)
        await send({"type": "http.response.body", "body": b"late"})

    _, addr = serve_asgi(routed(bad))
    with caplog.at_level(logging.ERROR, logger="sockherd.worker"):
        out = raw(addr, BAD)
    assert is_500(out), out
    assert b"Traceback" not in out and says.encode() not in out
    assert any(says in (r.exc_text or "") or (r.exc_info and says in str(r.exc_info[1]))
               for r in caplog.records), caplog.text
    still_serves(addr)


def test_send_after_the_response_raises_in_the_app(serve_asgi):
    seen = []

    async def app(scope, receive, send):
        await ok(scope, receive, send)
        try:
            await send({"type": "http.response.body", "body": b"more"})
        except RuntimeError as exc:
            seen.append(str(exc))

    _, addr = serve_asgi(app)
    still_serves(addr)
    assert seen and "after the response ended" in seen[0]


def test_a_task_left_running_does_not_hold_the_connection(serve_asgi):
    """The response ended: the next request is served while the app's task
    goes on (a background task after the response, as Starlette's)."""
    import asyncio

    async def app(scope, receive, send):
        await ok(scope, receive, send)
        await asyncio.sleep(30)

    _, addr = serve_asgi(app)
    out = raw(addr, b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n"
                    b"Connection: close\r\n\r\n")
    assert out.count(b"HTTP/1.1 200 OK") == 2 and out.endswith(b"ok /b")


def test_send_from_another_thread_is_refused(serve_asgi):
    """The connection is its loop thread's alone: a send() or receive()
    called from another thread (an executor's) raises RuntimeError in it
    and touches nothing; the request is then answered from the loop."""
    import asyncio

    seen = []

    async def app(scope, receive, send):
        def from_thread():
            out = []
            for call in (lambda: send({"type": "http.response.start", "status": 200,
                                       "headers": []}), receive):
                try:
                    call()
                except RuntimeError as exc:
                    out.append(str(exc))
            return out

        seen.extend(await asyncio.get_running_loop().run_in_executor(None, from_thread))
        await ok(scope, receive, send)

    _, addr = serve_asgi(app)
    still_serves(addr)
    assert len(seen) == 2 and all("not the connection's loop thread" in s for s in seen)


class Clears:
    """A dict key whose equality test (run by the lookup of another key
    of the same hash) or a value whose truth test empties the message."""

    def __init__(self, msg, like=None):
        self.msg, self.like = msg, like

    def __hash__(self):
        return hash(self.like)

    def __eq__(self, other):
        self.msg.clear()
        return False

    def __bool__(self):
        self.msg.clear()
        return False


def test_a_message_emptied_while_it_is_read(serve_asgi):
    """Review of issue 22's adapter, finding 1 (tests/asgi/
    test_asgi_message_values_kept.py shows the crash on a real server):
    send() read values it had taken out of the message after app code
    emptied it (a key's __eq__ in the lookup of "headers" freed the status;
    more_body's __bool__ freed the body). Under AddressSanitizer
    (test_http_asan.py runs this file) the read after the free is a report."""
    async def app(scope, receive, send):
        # 404 made at run time: a new int, freed with the message (not a cached one)
        start = {"type": "http.response.start", "status": int("40" + "4")}
        start[Clears(start, "headers")] = None           # same hash as "headers"
        await send(start)
        body = {"type": "http.response.body", "body": b"body of " + scope["path"].encode()}
        body["more_body"] = Clears(body)
        await send(body)

    _, addr = serve_asgi(app)
    out = raw(addr, b"GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 404 Not Found") and out.endswith(b"\r\n\r\nbody of /x"), out


def test_a_send_after_the_client_left_is_not_logged_as_an_app_failure(serve_asgi, caplog):
    """Finding (bench/asgi_loop.py, 2026-11-26): a client that goes away
    while the app awaits (wrk ending its run with requests in flight) made
    the app's next send() raise ClientDisconnected, as ASGI 2.4 says; the
    app not catching it, every such request was logged as `app failed`
    with a traceback. It is the client's doing: nothing is logged, and the
    loop serves on. An app's own error in the same position still is."""
    started, sent = threading.Event(), threading.Event()

    async def app(scope, receive, send):
        if scope["path"] == "/quick":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"quick"})
            return
        started.set()
        while (await receive())["type"] != "http.disconnect":
            pass
        try:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        finally:
            sent.set()

    _, addr = serve_asgi(app)
    with caplog.at_level(logging.ERROR, logger="sockherd.worker"):
        c = socket.create_connection(addr)
        c.sendall(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
        assert started.wait(10)
        c.close()
        assert sent.wait(10)
        # the same thread ran the slow task's end before it serves this
        assert raw(addr, b"GET /quick HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
                   ).endswith(b"quick")
    assert not [r for r in caplog.records if "app failed" in r.getMessage()], caplog.text
