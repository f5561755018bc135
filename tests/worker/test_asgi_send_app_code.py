"""What a send() does while the app's own code runs inside it (issue 35):
the message's values (more_body's, more_trailers' __bool__, a key's
__eq__) are the app's objects, and their code may empty the message or
call send() again.

  - point 2: http.response.trailers took a borrowed `headers`, then asked
    more_trailers for its truth; an app's __bool__ that empties the
    message freed the list, and the trailer block was read out of freed
    memory (other objects' bytes on the wire; ASan: a use after free).
  - point 5: a send() from inside more_body's __bool__ ended the response;
    the outer send() then wrote its bytes after that end, at the head of
    the next response on the keep-alive connection. It is refused: the
    app's error (a 500 before the head went out), the connection's next
    response whole.

A real Loop over a real fdcore Table on loopback (conftest.py's
serve_asgi); responses read with h11, a strict HTTP/1.1 client parser."""
from __future__ import annotations

import logging

import pytest

from test_asgi_trailers import START_T, TE, get, h11_responses  # noqa: E402
from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(60)

# what the freed memory is given to: lists and pairs of the same shape
KEEP = []


class EmptiesItsMessage:
    """more_trailers: True, and the message emptied when asked, the freed
    headers' memory then taken by new lists and pairs."""

    def __init__(self, msg):
        self.msg = msg

    def __bool__(self):
        self.msg.clear()
        for i in range(64):
            n = str(i).encode()
            KEEP.append([(b"x-other-" + n, b"reused-" + n)])
        return True


def trailers_app():
    async def app(scope, receive, send):
        if scope["path"] != "/t":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        await send(START_T)
        await send({"type": "http.response.body", "body": b"hello"})
        # the list and its pairs made here: the message holds their only reference
        msg = {"type": "http.response.trailers",
               "headers": [(b"x-checksum", b"abc%d" % 123)]}
        msg["more_trailers"] = EmptiesItsMessage(msg)
        await send(msg)
        await send({"type": "http.response.trailers", "headers": [(b"x-more", b"1")]})
    return app


def test_trailers_whose_more_trailers_empties_the_message_keep_their_headers(serve_asgi):
    _, addr = serve_asgi(trailers_app())
    got = h11_responses(addr, get(b"/t", TE) + get(b"/ok"), 2)
    resp, body, end = got[0]
    assert resp.status_code == 200 and body == b"hello"
    assert list(end.headers) == [(b"x-checksum", b"abc123"), (b"x-more", b"1")]
    assert got[1][0].status_code == 200 and got[1][1] == b"ok"


class SendsAgain:
    """more_body whose truth is asked by send(): it sends the body's end
    itself first (its RuntimeError kept to be told)."""

    def __init__(self, send, errors):
        self.send, self.errors = send, errors

    def __bool__(self):
        try:
            self.send({"type": "http.response.body", "body": b"inner"})
        except RuntimeError as exc:
            self.errors.append(str(exc))
            raise
        return True


def reentrant_app(errors):
    async def app(scope, receive, send):
        if scope["path"] != "/t":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"outer",
                    "more_body": SendsAgain(send, errors)})
        await send({"type": "http.response.body", "body": b""})
    return app


def test_a_send_from_inside_a_send_is_refused_and_the_next_response_is_whole(serve_asgi, caplog):
    errors = []
    _, addr = serve_asgi(reentrant_app(errors))
    with caplog.at_level(logging.ERROR, logger="sockherd.worker"):
        out = raw(addr, get(b"/t") + get(b"/ok"))
    # the app's error: a 500 (its connection then closes), none of the
    # app's bytes behind it, neither the inner send's nor the outer one's
    assert out.startswith(b"HTTP/1.1 500 "), out
    assert b"inner" not in out and b"outer" not in out, out
    assert h11_responses(addr, get(b"/ok"), 1)[0][1] == b"ok"
    assert errors and "while a send() of the same request is in progress" in errors[0], errors
    assert "in progress" in caplog.text, caplog.text
