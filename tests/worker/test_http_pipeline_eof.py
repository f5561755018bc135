"""Pipelined requests ahead of one cut short by the client's half-close
(found by test_http_framing_fuzz.py): the requests before it were given to
the app, so their answers must reach the client before the server closes."""
from __future__ import annotations

import socket

import pytest

from test_engine_fuzz import responses, send_pieces
from test_http_framing_fuzz import Echo

pytestmark = pytest.mark.timeout(60)

REQ = b"GET /%d HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nxxxxx"


@pytest.mark.parametrize("threads", [1, 2])
def test_answers_before_a_truncated_request_are_sent(serve_wsgi, threads):
    """Fuzz finding (fixed by issue 18 §4's flush before waiting on input):
    two complete requests, a third whose body stops a byte short, then
    SHUT_WR: the app served two, the client got no answer and a clean FIN (a head cut short instead, or nothing after the two, gets
    both answers)."""
    app = Echo()
    _, addr = serve_wsgi(app, threads=threads)
    data = REQ % 1 + REQ % 2 + (REQ % 3)[:-1]
    for _ in range(5):
        with socket.create_connection(addr, timeout=10) as c:
            port = c.getsockname()[1]
            got = responses(send_pieces(c, data, []))
        with app.lock:
            seen = app.seen.pop(port, [])
        assert len(seen) == 2
        assert [s for s, _ in got[:2]] == [200, 200], got
