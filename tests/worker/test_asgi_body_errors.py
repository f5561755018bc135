"""A request body the client gets wrong while the ASGI app waits for it in
receive() (issue 35, point 8): a chunked body past limit_request_body
(413) or a chunk size that is not hex (400). The finding: the waiting
receive() was given http.disconnect although the client was still
connected and told nothing; the app, having no body, returned, and the
client got a 500 with the log blaming the app ("returned without sending
http.response.start"). The rule now is the one a receive() called after
the error already had: the client gets the 413 or 400 (uvicorn answers a
bad chunk 400), the refusal is counted and logged with its reason (what
the client did wrong), the app reads http.disconnect and is not blamed
for what follows (its return, or its send() refused with
ClientDisconnected); once the response head went out nothing can be said,
the connection is closed mid-response.

A declared Content-Length past the limit never gets that far: the head
is refused 413 before the app runs (the last test proves it stays so).

A real Loop over a real fdcore Table on loopback (conftest.py's
serve_asgi); the request is written raw (a client library would not send
a bad chunk), the response read with h11, a strict HTTP/1.1 client
parser. body_buffer 0: every body still arriving streams to the app."""
from __future__ import annotations

import logging
import socket

import h11
import pytest

from test_asgi_flow_control import wait_until  # noqa: E402
from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(60)

HEAD = b"POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
GOOD = b"3e8\r\n" + b"x" * 1000 + b"\r\n"            # one chunk of 1000 bytes
TOO_MUCH = b"5dc\r\n" + b"y" * 1500 + b"\r\n"        # 1500 more: 2500 > 2000
BAD_SIZE = b"zz\r\n"


def reader_app(got: list, start_first: bool = False, answer_after: bool = False):
    """/up: reads its body with receive() (each message's type, and its
    body's size, appended to got) until its end or a disconnect; then
    answers with the size read. start_first: the head and a first part
    of the body go out before the reading; answer_after: on a disconnect
    it answers all the same (its send() then refused: the client is gone).
    Else `ok`."""
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
            got.append((msg["type"], len(msg.get("body", b""))))
            if msg["type"] == "http.disconnect":
                if not answer_after:
                    return                      # nothing more to say: the client is gone
                break
            size += len(msg["body"])
            if not msg["more_body"]:
                break
        if not start_first:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"%d" % size})
    return app


def waiting_for_more(got: list) -> bool:
    """The app got the first chunk (in one message or more, as it came)
    and, in the same step, waits for more."""
    return sum(n for _, n in got) == 1000


def h11_response(s: socket.socket):
    """The response on s as h11 reads it: (Response, body, ended), ended
    False when the connection closed before the end of the body."""
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="POST", target="/up",
                            headers=[("host", "h"), ("transfer-encoding", "chunked")]))
    resp, body = None, b""
    while True:
        ev = client.next_event()
        if ev is h11.NEED_DATA:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk and resp is not None:
                return resp, body, False
            assert chunk, "the connection closed before a response"
            client.receive_data(chunk)
            continue
        if isinstance(ev, h11.Response):
            resp = ev
        elif isinstance(ev, h11.Data):
            body += ev.data
        elif isinstance(ev, h11.EndOfMessage):
            return resp, body, True


def closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def refused_while_waiting(serve_asgi, caplog, tail: bytes, **app_kw):
    """The head and a good chunk sent, the app's receive() waiting for more,
    then `tail`: (loop, got, Response, body, ended)."""
    got = []
    loop, addr = serve_asgi(reader_app(got, **app_kw), body_buffer=0, limit_request_body=2000)
    with caplog.at_level(logging.INFO, logger="sockherd"), \
            socket.create_connection(addr, timeout=20) as s:
        s.sendall(HEAD + GOOD)
        wait_until(lambda: waiting_for_more(got), what="the app waiting for more body")
        s.sendall(tail)
        resp, body, ended = h11_response(s)
        assert closed(s)
        wait_until(lambda: got[-1][0] == "http.disconnect", what="the app's disconnect")
    # the loop serves on
    assert raw(addr, b"GET /o HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").endswith(b"ok")
    return loop, got, resp, body, ended


def not_blamed(caplog):
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert "app failed" not in caplog.text and "returned" not in caplog.text, caplog.text


@pytest.mark.parametrize("answer_after", [False, True], ids=["returns", "answers"])
def test_a_chunked_body_past_the_limit_is_answered_413(serve_asgi, caplog, answer_after):
    loop, got, resp, body, ended = refused_while_waiting(serve_asgi, caplog, TOO_MUCH,
                                                         answer_after=answer_after)
    assert resp.status_code == 413, (resp, body)
    assert b"request body too large" in body and ended
    assert (b"connection", b"close") in resp.headers
    assert got.count(("http.disconnect", 0)) == 1
    assert loop.engine.refused["body_too_large"] == 1
    assert loop.engine.refused["server_error"] == 0
    assert "refused 413" in caplog.text and "request body too large" in caplog.text, caplog.text
    not_blamed(caplog)


@pytest.mark.parametrize("answer_after", [False, True], ids=["returns", "answers"])
def test_a_bad_chunk_size_is_answered_400(serve_asgi, caplog, answer_after):
    loop, got, resp, body, ended = refused_while_waiting(serve_asgi, caplog, BAD_SIZE,
                                                         answer_after=answer_after)
    assert resp.status_code == 400, (resp, body)
    assert ended and (b"connection", b"close") in resp.headers
    assert got.count(("http.disconnect", 0)) == 1
    assert loop.engine.refused["bad_request"] == 1
    assert loop.engine.refused["server_error"] == 0
    assert "refused 400" in caplog.text, caplog.text
    not_blamed(caplog)


@pytest.mark.parametrize("tail,kind,status", [(TOO_MUCH, "body_too_large", 413),
                                              (BAD_SIZE, "bad_request", 400)],
                         ids=["413", "400"])
def test_after_the_head_went_out_the_connection_is_closed(serve_asgi, caplog, tail, kind,
                                                          status):
    loop, got, resp, body, ended = refused_while_waiting(serve_asgi, caplog, tail,
                                                         start_first=True)
    assert resp.status_code == 200 and body == b"reading" and not ended   # cut, not ended
    assert got.count(("http.disconnect", 0)) == 1
    assert loop.engine.refused[kind] == 1
    assert "refused %d" % status in caplog.text, caplog.text      # what the client did
    not_blamed(caplog)


def test_a_declared_length_past_the_limit_is_refused_before_the_app(serve_asgi, caplog):
    got = []
    loop, addr = serve_asgi(reader_app(got), body_buffer=0, limit_request_body=2000)
    with caplog.at_level(logging.INFO, logger="sockherd"), \
            socket.create_connection(addr, timeout=20) as s:
        s.sendall(b"POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 2500\r\n\r\n" + b"x" * 1000)
        resp, body, ended = h11_response(s)
    assert resp.status_code == 413 and ended, (resp, body)
    assert got == []                                   # the app never ran
    assert loop.engine.refused["body_too_large"] == 1
    not_blamed(caplog)
