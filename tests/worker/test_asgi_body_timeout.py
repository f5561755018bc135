"""body_timeout for a request body an ASGI app streams with receive()
(issue 22 §2; the finding: a client that stopped mid-body while the app
awaited receive() was waited for as long as the app waited, forever for an
app that just reads its body). The WSGI path's rule (worker/wsgi.py,
h1_timers.c): a body must arrive within body_timeout, a second more per
MIN_BODY_RATE (64 KiB) received; one that does not is answered 408 (the
engine's `body_timeout` refusal, logged) when the app started no response
yet, else the connection is closed. Here the app's receive() then
gives http.disconnect, and the loop thread is never held meanwhile (other
connections of the one loop thread are served). A real Loop over a real
fdcore Table on loopback (conftest.py's serve_asgi), raw sockets; bodies
larger than body_buffer (0 here) stream to the app."""
from __future__ import annotations

import logging
import socket
import time

import pytest

from test_asgi_flow_control import wait_until  # noqa: E402
from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def reader_app(got: list, start_first: bool = False):
    """/up: reads its body with receive() until the end or a disconnect
    (each message appended to got), then answers; else `ok`."""
    async def app(scope, receive, send):
        if scope["path"] != "/up":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        if start_first:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"reading", "more_body": True})
        size = 0
        while True:
            msg = await receive()
            got.append(msg["type"])
            if msg["type"] == "http.disconnect":
                return                              # nothing more to say: the client is gone
            size += len(msg["body"])
            if not msg["more_body"]:
                break
        if not start_first:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"%d" % size})
    return app


def read_until_close(s: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def test_a_stalled_body_is_answered_408_and_the_app_reads_a_disconnect(serve_asgi, caplog):
    got = []
    loop, addr = serve_asgi(reader_app(got), body_buffer=0, body_timeout=1.0)
    with caplog.at_level(logging.INFO, logger="sockherd.worker"), \
            socket.create_connection(addr, timeout=20) as s:
        s.sendall(b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
        wait_until(lambda: got, what="the app's first receive")
        t0 = time.monotonic()
        # the one loop thread serves others while the app waits for the body
        for i in range(5):
            assert raw(addr, b"GET /o HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
                       ).endswith(b"ok")
        out = read_until_close(s)
        waited = time.monotonic() - t0
    assert out.startswith(b"HTTP/1.1 408 Request Timeout"), out
    assert b"Connection: close" in out
    assert 0.5 < waited < 8, waited
    wait_until(lambda: got[-1] == "http.disconnect", what="the app's disconnect")
    assert got.count("http.disconnect") == 1
    assert loop.engine.refused["body_timeout"] == 1
    assert "408" in caplog.text, caplog.text


def test_a_stalled_body_after_the_head_went_out_closes_the_connection(serve_asgi):
    got = []
    loop, addr = serve_asgi(reader_app(got, start_first=True), body_buffer=0, body_timeout=1.0)
    with socket.create_connection(addr, timeout=20) as s:
        s.sendall(b"POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"3e8\r\n" + b"x" * 1000 + b"\r\n")
        out = read_until_close(s)
    assert out.startswith(b"HTTP/1.1 200 OK") and b"reading" in out, out
    assert not out.endswith(b"0\r\n\r\n"), out                   # cut, not ended
    wait_until(lambda: got and got[-1] == "http.disconnect", what="the app's disconnect")
    assert loop.engine.refused["body_timeout"] == 1
    assert raw(addr, b"GET /o HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").endswith(b"ok")


def test_a_body_arriving_at_the_minimum_rate_is_not_cut(serve_asgi):
    """64 KiB every 0.4 s (160 KiB/s, above MIN_BODY_RATE) for 3 s against a
    body_timeout of 1 s: each piece buys its second, the body is whole."""
    got = []
    _, addr = serve_asgi(reader_app(got), body_buffer=0, body_timeout=1.0)
    piece = b"y" * (64 << 10)
    total = 8 * len(piece)
    with socket.create_connection(addr, timeout=20) as s:
        s.sendall(b"POST /up HTTP/1.1\r\nHost: h\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n" % total)
        for _ in range(8):
            s.sendall(piece)
            time.sleep(0.4)
        out = read_until_close(s)
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"%d" % total), out
    assert "http.disconnect" not in got


def test_an_app_slower_than_body_timeout_is_not_the_clients_fault(serve_asgi):
    """The app waits for the first part of the body (the client's time),
    then works 2 s (past body_timeout) while the rest arrives, then reads
    on: its own time is never the client's, nothing is cut."""
    import asyncio

    got = []

    async def app(scope, receive, send):
        got.append("entered")              # then receive(), in the same step
        first = await receive()
        got.append(first["type"])
        await asyncio.sleep(2.0)
        size = len(first["body"])
        more = first["more_body"]
        while more:
            msg = await receive()
            got.append(msg["type"])
            if msg["type"] != "http.request":
                return
            size += len(msg["body"])
            more = msg["more_body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"%d" % size})

    _, addr = serve_asgi(app, body_buffer=0, body_timeout=1.0)
    with socket.create_connection(addr, timeout=20) as s:
        s.sendall(b"POST /up HTTP/1.1\r\nHost: h\r\nConnection: close\r\n"
                  b"Content-Length: 5000\r\n\r\n")
        wait_until(lambda: got, what="the app waiting for its body")
        s.sendall(b"z" * 2000)
        wait_until(lambda: len(got) > 1, what="the first part received")
        s.sendall(b"z" * 3000)
        out = read_until_close(s)
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"5000"), out
    assert "http.disconnect" not in got


# ---- a receive() the app abandoned (issue 35, point 11) ----------------------------------------
#
# The finding: the body timer, armed by a receive() that waited, ran on
# after the app stopped waiting (asyncio.wait_for's timeout cancelled the
# receive) and went on to answer: at body_timeout a 408 replaced the
# app's own answer, or the connection was cut under its streamed one.
# The body timer is the client's time while the app waits for its body;
# once the app abandoned that wait, or started its response, it never
# replaces the app's answer. The body unread, the connection closes after
# the response (parser_finish), as for any app that does not read it.

def abandoning_app(got: list, stream: bool = False):
    """/up: reads its body, each receive() waited for 0.2 s at most; the
    first one past that (wait_for's timeout cancels it) is the last: then
    it works 1.5 s (past body_timeout) and answers `answered`; stream: the
    answer in 4 parts over that time instead. Else `ok`."""
    import asyncio

    async def app(scope, receive, send):
        if scope["path"] != "/up":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        while True:
            try:
                msg = await asyncio.wait_for(receive(), 0.2)
            except asyncio.TimeoutError:
                got.append("abandoned")
                break
            got.append(msg["type"])
        if stream:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for part in (b"an", b"sw", b"er"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
                await asyncio.sleep(0.5)
            await send({"type": "http.response.body", "body": b"ed"})
        else:
            await asyncio.sleep(1.5)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"answered"})
        got.append("sent")
    return app


def h11_read(s: socket.socket):
    """(Response, body, ended) as h11 reads them off s."""
    import h11

    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="POST", target="/up",
                            headers=[("host", "h"), ("content-length", "100000")]))
    resp, body = None, b""
    while True:
        ev = client.next_event()
        if ev is h11.NEED_DATA:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return resp, body, False
            client.receive_data(chunk)
        elif isinstance(ev, h11.Response):
            resp = ev
        elif isinstance(ev, h11.Data):
            body += ev.data
        elif isinstance(ev, h11.EndOfMessage):
            return resp, body, True


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_abandoned_receive_leaves_the_app_its_answer(serve_asgi, stream):
    got = []
    loop, addr = serve_asgi(abandoning_app(got, stream), body_buffer=0, body_timeout=1.0)
    with socket.create_connection(addr, timeout=20) as s:
        s.sendall(b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
        resp, body, ended = h11_read(s)
        assert read_until_close(s) == b""      # the body unread: closed after the answer
    assert resp is not None and resp.status_code == 200, (resp, body)
    assert body == b"answered" and ended, body
    assert got == ["http.request", "abandoned", "sent"], got
    assert loop.engine.refused["body_timeout"] == 0
    assert raw(addr, b"GET /o HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").endswith(b"ok")


def test_a_started_response_is_not_replaced_by_a_408(serve_asgi):
    """The app started its response (its head held until the first body
    part), then waits for a body the client stalls: the wait ends with
    http.disconnect and the connection closes, counted as the body
    timeout; no 408 says what the app did not."""
    got = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        while True:
            msg = await receive()
            got.append(msg["type"])
            if msg["type"] == "http.disconnect" or not msg["more_body"]:
                return

    loop, addr = serve_asgi(app, body_buffer=0, body_timeout=1.0)
    with socket.create_connection(addr, timeout=20) as s:
        s.sendall(b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
        out = read_until_close(s)
    assert b"408" not in out, out
    wait_until(lambda: got and got[-1] == "http.disconnect", what="the app's disconnect")
    assert loop.engine.refused["body_timeout"] == 1
