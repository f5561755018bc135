"""The request-duration histogram (issue 36 §6): on a real master with
--metrics, WSGI and ASGI, every request the app answers is counted once in
`sockherd_worker_request_duration_seconds`, in the bucket of its duration
(prometheus_client's default buckets, as the common exporters), with the
seconds' sum; the buckets are cumulative and end at +Inf = _count. A
request the engine refuses itself is no app request: not counted. Before:
no duration figure at all."""
from __future__ import annotations

import http.client
import socket

import pytest

from test_metrics import scrape
from test_reload import free_port
from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(90)

BOUNDS = ("0.005", "0.01", "0.025", "0.05", "0.075", "0.1", "0.25", "0.5", "0.75", "1.0",
          "2.5", "5.0", "7.5", "10.0", "+Inf")
NAME = "sockherd_worker_request_duration_seconds"

WSGI = """
import time

def app(environ, start_response):
    time.sleep(float(environ["PATH_INFO"].strip("/") or 0))
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]
"""

ASGI = """
import asyncio

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await asyncio.sleep(float(scope["path"].strip("/") or 0))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
"""

# (the path: seconds the app sleeps, how many): 4 fast, 3 in (0.05, 0.075],
# 2 in (0.25, 0.5]
ASKED = (("/0", 4), ("/0.06", 3), ("/0.3", 2))


def _get(port: int, path: str) -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


def _histogram(mport: int) -> tuple[dict[str, float], float, float]:
    fams = scrape(mport)
    buckets = {s.labels["le"]: s.value for s in fams.get(NAME + "_bucket", ())}
    count = sum(s.value for s in fams.get(NAME + "_count", ()))
    total = sum(s.value for s in fams.get(NAME + "_sum", ()))
    return buckets, count, total


@pytest.mark.parametrize("interface,source", [("wsgi", WSGI), ("asgi", ASGI)])
def test_each_app_request_lands_in_its_durations_bucket(master, tmp_path, interface, source):
    (tmp_path / "timed.py").write_text(source)
    mport = free_port()
    m = master("timed:app", "-w", "1", "--metrics", f"127.0.0.1:{mport}", ready=1)
    m.wait_log(rf"metrics on http://127\.0\.0\.1:{mport}/metrics")
    buckets, count, _ = _histogram(mport)
    assert tuple(buckets) == BOUNDS and count == 0, buckets      # every bucket, from the start
    for path, n in ASKED:
        for _ in range(n):
            assert _get(m.port, path) == 200
    # a request the engine refuses itself (a bad request line): no app request
    with socket.create_connection(("127.0.0.1", m.port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: x\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    # the counts follow the answers (a scrape is the worker's own answer)
    wait_for(lambda: _histogram(mport)[1] == 9, 10, "the 9 requests counted")
    buckets, count, total = _histogram(mport)
    cumulative = [buckets[b] for b in BOUNDS]
    assert cumulative == sorted(cumulative) and buckets["+Inf"] == count == 9, buckets
    # below each sleep's bound nothing that slept longer; within its bucket
    # all but one (a loaded box may stall one request on its way out)
    assert 2 <= buckets["0.005"] and 3 <= buckets["0.05"] <= 4, buckets   # the 4 fast ones
    assert 6 <= buckets["0.25"] <= 7, buckets                              # and the 60 ms
    assert 8 <= buckets["0.5"], buckets                                    # and the 300 ms
    assert 3 * 0.06 + 2 * 0.3 <= total < 3 * 0.06 + 2 * 0.3 + 1.0, total
