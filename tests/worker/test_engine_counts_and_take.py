"""Adversarial review of the native engine's counting and take() changes
(diff from 69269fd: engine.c Server.take / retire_after / requests and
responses[] with status_class(); conn_refuse counting (h1_timers.c); wsgi_app.c
r->code and the count at the end of respond()).

The FINDING tests fail on the code as reviewed; the GUARD tests pin what
was checked and held. Real sockets, an in-process worker (conftest.py's
serve_wsgi fixture)."""
from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from test_engine_connection_lifecycle import closed_within, recv_until  # noqa: E402
from test_http_parser_and_wsgi_framing import wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(60)

CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx", "other")


def expect(**by_class) -> dict:
    return {k: by_class.get(k, 0) for k in CLASSES}


def settle(engine, n: int, timeout: float = 10.0) -> None:
    """Waits until the engine counted n requests and then a little longer
    (a count past n would show up too)."""
    wait_for(lambda: engine.requests >= n, timeout)
    time.sleep(0.1)


def on_loop_thread(loop, fn, pos: int = 0, timeout: float = 10.0):
    """fn() run by loop thread pos (its mailbox, as Loop.post does);
    returns its result, or raises what it raised."""
    done = threading.Event()
    box = {}

    def run():
        try:
            box["r"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["e"] = exc
        finally:
            done.set()

    loop._mail[pos].append((run, ()))
    loop.table.wake(loop.loop_threads[pos].tid)
    assert done.wait(timeout), "the loop thread did not run it"
    if "e" in box:
        raise box["e"]
    return box["r"]


def get(path: str, method: str = "GET", close: bool = False) -> bytes:
    extra = b"Connection: close\r\n" if close else b""
    return b"%s %s HTTP/1.1\r\nHost: h\r\n%s\r\n" % (method.encode(), path.encode(), extra)


def mixed(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/ok":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]
    if path == "/nf":
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"nope"]
    if path == "/nc":
        start_response("204 No Content", [])
        return [b"ignored"]
    if path == "/nm":
        start_response("304 Not Modified", [("ETag", '"x"')])
        return []
    if path == "/exc":
        start_response("200 OK", [("Content-Type", "text/plain")])
        try:
            raise RuntimeError("changed my mind")
        except RuntimeError:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")],
                           sys.exc_info())
        return [b"busy"]
    if path == "/boom":
        raise RuntimeError("before start_response")
    if path == "/late":
        start_response("200 OK", [("Content-Type", "text/plain")])
        raise RuntimeError("after start_response, before any body")
    if path == "/badstatus":
        start_response("600 Nope", [])
        return [b"x"]
    if path == "/stream":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return iter([b"a", b"b", b"c"])
    start_response("200 OK", [])
    return [b"?"]


def status_lines(out: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", out)]


# ==== findings ==========================================================================

# ---- F1: a bad request body is counted twice ---------------------------------------------
# wsgi_app.c respond(), BadBody branch: `conn_refuse(c, status, reason)`,
# and h1_conn.c conn_refuse (h1_timers.c since the split) does `responses[status_class(status)]++`; then
# respond() falls through to the common tail, which counts the same
# request again: `s->responses[status_class(r->code)]++` with r->code the
# app's status (200 here) or 0 ("other") if it had not called
# start_response. One 400 on the wire: responses 2xx=1 AND 4xx=1 (or
# other=1 AND 4xx=1), requests=1.

def _reads_body(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    data = environ["wsgi.input"].read()
    return [b"got %d" % len(data)]


def _reads_body_first(environ, start_response):
    data = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"got %d" % len(data)]


@pytest.mark.parametrize("app", [_reads_body, _reads_body_first],
                         ids=["start_response-first", "body-first"])
def test_bad_chunked_body_is_counted_once_as_4xx(serve_wsgi, app):
    loop, addr = serve_wsgi(app)
    with socket.create_connection(addr, timeout=10) as c:
        # the head alone: the slow path runs the app, which reads the body
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
        time.sleep(0.3)
        c.sendall(b"zz\r\n")                       # not a chunk size: BadBody(400)
        closed, out = closed_within(c, 5)
    assert closed and status_lines(out) == [400], out
    settle(loop.engine, 1)
    assert loop.engine.requests == 1
    assert loop.engine.responses == expect(**{"4xx": 1}), loop.engine.responses


# ---- F2: refusals are in responses[] but not in requests ----------------------------------
# h1_conn.c conn_refuse (h1_timers.c since the split) counts `responses[...]++` and nothing else; requests
# is only bumped at the end of wsgi_app.c respond(). The engine counts requests
# "answered (every response framed)", and master/metrics.py exports both
# (sockherd_worker_requests, sockherd_worker_responses): after a pipeline
# whose second request is malformed, two responses are framed, responses
# add up to 2, requests says 1. Same for the 408 of a head timeout and a
# 413/431/414 at the head. Either count the refusal in requests too (one
# place, e.g. a count_response(s, status) helper both paths call) or keep
# refusals out of responses[]; the two metrics must agree.

def test_refused_request_after_a_good_one_counts_in_requests_too(serve_wsgi):
    loop, addr = serve_wsgi(mixed)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(get("/ok") + b"GARBAGE\r\n\r\n")
        closed, out = closed_within(c, 5)
    assert closed and status_lines(out) == [200, 400], out
    settle(loop.engine, 1)
    resp = loop.engine.responses
    assert resp == expect(**{"2xx": 1, "4xx": 1}), resp
    assert sum(resp.values()) == loop.engine.requests, (loop.engine.requests, resp)


# ---- F3: max_requests never fires if set at or below the count already reached -------------
# respond.c then: `if (++s->requests == s->retire_at && s->on_retire)`: equality,
# so retire_after(n, fn) with n <= requests already answered never calls
# fn. worker/bootstrap.py calls retire_after(loop, ...) after loop.start()
# (line ~99) and after the board set-up (line ~269): the listeners are
# shared with the running workers, so requests can be answered in between;
# with a small max_requests (or a reload under load) the worker then never
# asks to be replaced. Fix: `>=` and clear on_retire once called (still
# once), or have retire_after() compare with s->requests (fire on the next
# request if already past).

def test_retire_after_set_below_the_count_already_reached_still_fires(serve_wsgi):
    loop, addr = serve_wsgi(mixed)
    engine = loop.engine
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(get("/ok") * 3)
        assert recv_until(c, lambda b: b.count(b"\r\n\r\nok") == 3).count(b"\r\n\r\nok") == 3
        settle(engine, 3)
        calls = []
        engine.retire_after(2, lambda: calls.append(engine.requests))
        c.sendall(get("/ok") * 2)
        assert recv_until(c, lambda b: b.count(b"\r\n\r\nok") == 2).count(b"\r\n\r\nok") == 2
    settle(engine, 5)
    assert len(calls) == 1, calls


# ---- F4: a client gone before anything went out is counted as a 2xx ------------------------
# respond.c respond(): the ClientGone branch clears the error and closes,
# then the common tail counts `responses[status_class(r->code)]++` with the
# code the app passed to start_response, although no byte of it was sent
# (headers_sent == 0). A client that drops mid-upload counts as a 200 in
# sockherd_worker_responses{class="2xx"}. Count it as "other" (no
# response) when !r->headers_sent, as the r->code == 0 case already is.

def test_client_gone_before_the_head_is_not_counted_as_2xx(serve_wsgi):
    loop, addr = serve_wsgi(_reads_body)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n" + b"x" * 10)
        time.sleep(0.3)
        c.shutdown(socket.SHUT_WR)                  # mid-body: ClientGone in the app's read
        closed, out = closed_within(c, 5)
    assert closed and out == b"", out
    settle(loop.engine, 1)
    assert loop.engine.responses["2xx"] == 0, loop.engine.responses


# ---- F5: take() of an fd the table already holds closes that fd ----------------------------
# engine_accept.c take_fd: `if (fd >= s->maxfd || s->api.insert(...) < 0) { close(fd);
# return 0; }`: fdc_insert refuses a number whose entry is in use (-EEXIST,
# fd_table.c I2), and take_fd then closes it: a live connection's socket, under
# its HttpConn and the table entry (which later close()s the number again:
# possibly someone else's by then). Server.take is a public method; a
# caller error must not destroy another connection. Fix: on -EEXIST (or
# s->conns[fd] != NULL) raise (ValueError) without closing.

def test_take_of_a_live_connection_fd_does_not_close_it(serve_wsgi):
    loop, addr = serve_wsgi(mixed)
    engine = loop.engine
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(get("/ok"))
        assert recv_until(c, lambda b: b.endswith(b"ok")).endswith(b"ok")
        assert wait_for(lambda: len(loop.conns) == 1)
        fd = next(iter(loop.conns))
        try:
            on_loop_thread(loop, lambda: engine.take(0, fd))
        except Exception:                          # noqa: BLE001 - a refusal is fine
            pass
        try:
            # if the number was closed, keep a new open file off it (the
            # table's own close at the end would then close this one)
            ph = os.open(os.devnull, os.O_RDONLY)
            if ph != fd:
                os.close(ph)
            c.sendall(get("/ok"))
            out = recv_until(c, lambda b: b.endswith(b"ok"), timeout=3)
        except OSError as exc:
            out = repr(exc).encode()
    assert out.endswith(b"ok"), out


# ==== guards ==============================================================================

def test_guard_responses_by_class_add_up_to_requests(serve_wsgi):
    """200 / HEAD / 404 / 204 / 304 / a status changed by exc_info /
    a streamed body, pipelined on one connection; a 500 before and one
    after start_response on their own; a status out of range (500)."""
    loop, addr = serve_wsgi(mixed)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(get("/ok") + get("/ok", "HEAD") + get("/nf") + get("/nc") + get("/nm") +
                  get("/exc") + get("/stream") + get("/ok", close=True))
        closed, out = closed_within(c, 5)
    assert closed and status_lines(out) == [200, 200, 404, 204, 304, 503, 200, 200], out
    for path in ("/boom", "/late", "/badstatus"):
        with socket.create_connection(addr, timeout=10) as c:
            c.sendall(get(path))
            closed, out = closed_within(c, 5)
        assert closed and status_lines(out) == [500], (path, out)
    settle(loop.engine, 11)
    assert loop.engine.requests == 11
    resp = loop.engine.responses
    assert resp == expect(**{"2xx": 5, "3xx": 1, "4xx": 1, "5xx": 4}), resp
    assert sum(resp.values()) == loop.engine.requests


def test_guard_100_continue_counts_one_response(serve_wsgi):
    loop, addr = serve_wsgi(_reads_body)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        first = recv_until(c, lambda b: b"100 Continue\r\n\r\n" in b)
        assert b"100 Continue" in first, first
        c.sendall(b"hello")
        out = recv_until(c, lambda b: b.endswith(b"got 5"))
    assert out.endswith(b"got 5"), out
    settle(loop.engine, 1)
    assert loop.engine.requests == 1
    assert loop.engine.responses == expect(**{"2xx": 1}), loop.engine.responses


def test_guard_retire_after_fires_once_on_a_loop_thread_at_the_nth(serve_wsgi):
    loop, addr = serve_wsgi(mixed, threads=2)
    engine = loop.engine
    calls = []
    engine.retire_after(3, lambda: calls.append((engine.requests,
                                                 threading.current_thread().name)))
    for _ in range(3):
        with socket.create_connection(addr, timeout=10) as c:
            c.sendall(get("/ok") * 2)
            assert recv_until(c, lambda b: b.count(b"\r\n\r\nok") == 2).count(b"\r\n\r\nok") == 2
    settle(engine, 6)
    assert len(calls) == 1, calls
    assert calls[0][0] == 3 and calls[0][1].startswith("sockherd-"), calls


def test_guard_take_serves_a_connection_accepted_elsewhere(serve_wsgi):
    loop, addr = serve_wsgi(mixed)
    engine = loop.engine
    with socket.create_server(("127.0.0.1", 0)) as other:
        with socket.create_connection(other.getsockname(), timeout=10) as c:
            s, _ = other.accept()
            s.setblocking(False)
            fd = s.detach()
            assert on_loop_thread(loop, lambda: engine.take(0, fd)) is True
            assert wait_for(lambda: fd in loop.conns)
            c.sendall(get("/ok") + get("/nf", close=True))
            closed, out = closed_within(c, 5)
    assert closed and status_lines(out) == [200, 404], out
    settle(loop.engine, 2)
    assert loop.engine.responses == expect(**{"2xx": 1, "4xx": 1})
    assert wait_for(lambda: fd not in loop.conns and engine.count == 0)
