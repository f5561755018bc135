"""Per-request dispatch (worker/native/dispatch.c): what a loop thread
records for a connection another thread is inside (missed reports, a
missed timer) is all replayed by that thread before it lets go, whatever
was recorded together. On an in-process worker of one group of two loop
threads (conftest.py's serve_wsgi, real sockets), with the interleaving
forced through the Python loop's own steps (worker/loop.py), each held on
an event by a wrapper that then calls the real step.

Review finding (issue 21 review, dispatch_run): the first read of a new
connection is served as a report of its own (EV_FIRST, Server.serve_accepted);
recorded as missed while a sibling was inside the connection, it was merged
with a read report recorded too, and hconn_on_events served EV_FIRST and
returned: the read report was dropped, and as the connection is polled
edge-triggered nothing announced those bytes again: a pipelined request
never answered."""
from __future__ import annotations

import collections
import socket
import threading
import time

import pytest

from test_http_review import wait_for

pytestmark = pytest.mark.timeout(60)


def read_responses(s: socket.socket, n: int) -> list[bytes]:
    """n Content-Length responses off s: their bodies."""
    buf, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, f"closed after {out}"
            buf += chunk
        head, _, buf = buf.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(buf) < length:
            chunk = s.recv(65536)
            assert chunk, f"closed mid-body after {out}"
            buf += chunk
        out.append(buf[:length])
        buf = buf[length:]
    return out


def test_a_read_report_missed_with_the_first_read_is_replayed(serve_wsgi):
    """X accepts a connection whose first request its first read brought;
    before X serves it (serve_accepted), a pipelined second request wakes
    the sibling Y, which serves the first one and blocks in the app. X's
    EV_FIRST is recorded as missed; then a third request arrives and X
    records its read report too. Y replays both: all three are answered
    (before the fix the third never was)."""
    release, entered = threading.Event(), threading.Event()

    def app(environ, start_response):
        q = environ["QUERY_STRING"]
        if q == "block":
            entered.set()
            release.wait(20)
        body = q.encode()
        start_response("200 OK", [("Content-Length", str(len(body)))])
        return [body]

    loop, addr = serve_wsgi(app, threads=2)
    assert loop.engine.dispatch
    sent, accepted, go, first_done = (threading.Event() for _ in range(4))
    turns: collections.Counter = collections.Counter()
    x = {}
    real_accept, real_requeue = loop._accept, loop._requeue
    real_native, real_resume = loop._accept_native, loop._resume_accepting

    def accept(th, lfd, relieved):
        sent.wait(10)                       # the request is in before the accept
        return real_accept(th, lfd, relieved)

    def requeue(th, lfd):
        real_requeue(th, lfd)
        if not accepted.is_set():
            accepted.set()                  # between the accept and serve_accepted
            go.wait(10)

    def accept_native(th, lfd, batch, ahead):
        real_native(th, lfd, batch, ahead)
        if not first_done.is_set():
            x["tid"], x["turns"] = th.tid, turns[th.tid]
            first_done.set()

    def resume(th):
        turns[th.tid] += 1                  # once per loop iteration, before its turn
        return real_resume(th)

    loop._resume_accepting = resume
    loop._accept_native = accept_native
    loop._requeue = requeue
    loop._accept = accept
    try:
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(b"GET /?block HTTP/1.1\r\nHost: h\r\n\r\n")
            sent.set()
            assert wait_for(accepted.is_set), "the accept"
            s.sendall(b"GET /?two HTTP/1.1\r\nHost: h\r\n\r\n")
            assert wait_for(entered.is_set), "the sibling inside the app"
            go.set()
            assert wait_for(first_done.is_set), "serve_accepted"
            # X back in its loop, then a turn that handled the third's report
            assert wait_for(lambda: turns[x["tid"]] >= x["turns"] + 1), "X's next turn"
            s.sendall(b"GET /?three HTTP/1.1\r\nHost: h\r\n\r\n")
            assert wait_for(lambda: turns[x["tid"]] >= x["turns"] + 2), "X's turn after the third"
            release.set()
            s.settimeout(5)
            assert read_responses(s, 3) == [b"block", b"two", b"three"]
    finally:
        release.set()
        go.set()
        sent.set()
