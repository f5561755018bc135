"""Requests the engine refuses itself are visible: counted by reason
(Server.refused, the worker's report, the metrics) and logged with the
peer and the reason, at most a line a second per worker with the count
since the last line. Issue 18 section 4."""
from __future__ import annotations

import logging
import re
import socket
import time

import pytest

from test_http_parser_and_wsgi_framing import wait_for

pytestmark = pytest.mark.timeout(60)

NO_HOST = b"GET / HTTP/1.1\r\n\r\n"
LONG_URI = b"GET /" + b"u" * 9000 + b" HTTP/1.1\r\nHost: h\r\n\r\n"


@pytest.fixture
def serve(serve_wsgi):
    return serve_wsgi                   # conftest.py


def refused_once(addr, data: bytes) -> tuple[bytes, int]:
    """Sends a request to refuse; (the answer, our port)."""
    with socket.create_connection(addr, timeout=10) as c:
        port = c.getsockname()[1]
        c.sendall(data)
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    return out, port


def refusal_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "sockherd.worker" and r.getMessage().startswith("refused ")]


def test_refusals_are_counted_by_reason(serve):
    """Defect: a refused request showed only as a 4xx in the response
    classes, with no reason anywhere."""
    loop, addr = serve(lambda e, s: [])
    for _ in range(3):
        assert refused_once(addr, NO_HOST)[0].startswith(b"HTTP/1.1 400 ")
    assert refused_once(addr, LONG_URI)[0].startswith(b"HTTP/1.1 414 ")
    refused = loop.engine.refused
    assert refused["bad_request"] == 3 and refused["uri_too_long"] == 1
    assert sum(refused.values()) == 4


def test_refusals_are_logged_with_peer_and_reason_at_most_once_a_second(serve, caplog):
    """Defect: requests the engine refused were invisible in the log at the
    default level. A burst gives one line (peer, status, reason); the next
    line, a second later at the earliest, says how many came in between."""
    caplog.set_level(logging.INFO, logger="sockherd.worker")
    _, addr = serve(lambda e, s: [])
    started = time.monotonic()
    _, port = refused_once(addr, NO_HOST)
    for _ in range(9):
        refused_once(addr, NO_HOST)
    burst = time.monotonic() - started
    lines = refusal_lines(caplog)
    assert 1 <= len(lines) <= 1 + int(burst), lines
    assert re.fullmatch(rf"refused 400 from 127\.0\.0\.1:{port}: missing Host field", lines[0])
    # more refusals until the next line comes (the window is a second)
    sent = [10]

    def one_more() -> bool:
        refused_once(addr, NO_HOST)
        sent[0] += 1
        return len(refusal_lines(caplog)) > len(lines)

    assert wait_for(one_more, timeout=15, step=0.05)
    lines = refusal_lines(caplog)
    counts = [int(m.group(1)) if (m := re.search(r"\((\d+) refused since the last line\)", ln))
              else 1 for ln in lines]
    assert sum(counts) == sent[0], (lines, sent)
    assert lines[-1].startswith("refused 400 from 127.0.0.1:")
