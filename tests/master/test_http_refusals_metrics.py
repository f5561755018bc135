"""The requests the engine refuses, seen from outside with a real master
and workers: counted by reason in the metrics
(sockherd_http_rejected_total{reason=...}) and logged with the peer and
the reason at the default log level. Issue 18 section 4."""
from __future__ import annotations

import socket

import pytest

from test_metrics import scrape, start, value
from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


def refuse(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(data)
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    return out


def test_refused_requests_are_counted_by_reason_and_logged(master, tmp_path):
    """Defect: requests the engine refused (here 400 for a missing Host,
    414 for a long target) were in no metric by reason and in no log line
    at the default level."""
    m, mport = start(master, tmp_path)
    for _ in range(4):
        assert refuse(m.port, b"GET / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert refuse(m.port, b"GET /" + b"u" * 9000 + b" HTTP/1.1\r\nHost: h\r\n\r\n") \
        .startswith(b"HTTP/1.1 414 ")
    fams = wait_for(lambda: (f := scrape(mport))
                    and value(f, "sockherd_http_rejected_total", reason="bad_request") == 4
                    and f, 10, lambda: "4 bad_request refusals in the metrics")
    assert value(fams, "sockherd_http_rejected_total", reason="uri_too_long") == 1
    assert value(fams, "sockherd_http_rejected_total") == 5
    m.wait_log(r"refused 400 from 127\.0\.0\.1:\d+: missing Host field")
