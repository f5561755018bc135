"""The wsgi interface in-process: a real worker Loop over a real fdcore Table
on loopback, real HTTP clients (http.client and raw sockets), PEP 3333
apps. The strictness of parsing itself is tested in test_http_parser.py."""
from __future__ import annotations

import http.client
import socket
import threading
import time

import pytest

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def serve(serve_wsgi):
    return serve_wsgi                   # conftest.py


def hello(environ, start_response):
    body = b"hello " + environ["PATH_INFO"].encode("latin-1")
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body]


def raw(addr, data: bytes, until_close=True, timeout=10) -> bytes:
    with socket.create_connection(addr, timeout=timeout) as c:
        c.sendall(data)
        out = b""
        while True:
            chunk = c.recv(65536)
            if not chunk:
                return out
            out += chunk


def test_get_with_keep_alive_and_headers(serve):
    _, addr = serve(hello)
    conn = http.client.HTTPConnection(*addr, timeout=10)
    for path in ("/a", "/b%20c"):
        conn.request("GET", path)
        r = conn.getresponse()
        assert r.status == 200 and r.read() == b"hello " + path.replace("%20", " ").encode()
        assert r.getheader("Content-Length") == str(len(b"hello " + path.encode()) -
                                                     (2 if "%20" in path else 0))
        assert r.getheader("Date") and r.getheader("Connection") is None
    conn.close()


def test_environ_keys(serve):
    seen = {}

    def app(environ, start_response):
        seen.update(environ)
        start_response("204 No Content", [])
        return []

    _, addr = serve(app, root_path="/app")
    out = raw(addr, b"GET /app/x?q=1 HTTP/1.1\r\nHost: h:1\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 204 No Content\r\n")
    assert seen["SCRIPT_NAME"] == "/app" and seen["PATH_INFO"] == "/x"
    assert seen["QUERY_STRING"] == "q=1" and seen["SERVER_PORT"] == str(addr[1])
    assert seen["REMOTE_ADDR"] == "127.0.0.1" and seen["wsgi.version"] == (1, 0)
    assert seen["wsgi.url_scheme"] == "http" and seen["wsgi.multithread"] is False
    assert seen["wsgi.input_terminated"] is True and seen["HTTP_HOST"] == "h:1"


def test_pipelined_requests_are_answered_in_order(serve):
    _, addr = serve(hello)
    out = raw(addr, b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\nGET /2 HTTP/1.1\r\nHost: h\r\n\r\n"
                    b"GET /3 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    bodies = [part.split(b"\r\n\r\n", 1)[1] for part in out.split(b"HTTP/1.1 200 OK")[1:]]
    assert bodies == [b"hello /1", b"hello /2", b"hello /3"]
    assert out.count(b"Connection: close") == 1


def echo_body(environ, start_response):
    data = environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    if environ["QUERY_STRING"] == "gen":
        return iter([b"%d:" % len(data), data])   # two chunks, length unknown: chunked
    return [b"%d:" % len(data), data]             # a list: its length is known


def test_content_length_and_chunked_request_bodies(serve):
    _, addr = serve(echo_body)
    conn = http.client.HTTPConnection(*addr, timeout=10)
    conn.request("POST", "/", body=b"x" * 100000)
    r = conn.getresponse()
    assert r.getheader("Content-Length") == "100007" and r.read() == b"100000:" + b"x" * 100000
    conn.request("POST", "/?gen", body=b"x" * 100000)
    r = conn.getresponse()
    assert r.getheader("Transfer-Encoding") == "chunked" and r.read() == b"100000:" + b"x" * 100000
    conn.request("POST", "/", body=iter([b"ab", b"cd", b"e"]), encode_chunked=True,
                 headers={"Transfer-Encoding": "chunked"})
    assert conn.getresponse().read() == b"5:abcde"
    conn.close()


def test_large_upload_is_read_in_a_stream(serve):
    sizes = []

    def app(environ, start_response):
        inp, total = environ["wsgi.input"], 0
        while chunk := inp.read(1 << 16):
            sizes.append(len(chunk))
            total += len(chunk)
        start_response("200 OK", [])
        return [b"%d" % total]

    _, addr = serve(app)
    total = 20 << 20
    with socket.create_connection(addr, timeout=30) as c:
        c.sendall(b"PUT / HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % total)
        block = b"z" * (1 << 20)
        for _ in range(20):
            c.sendall(block)
        resp = b""
        while not resp.endswith(b"%d" % total):
            resp += c.recv(4096)
    assert max(sizes) <= 1 << 16 and sum(sizes) == total


def test_expect_100_continue_answered_when_the_app_reads(serve):
    _, addr = serve(echo_body)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"POST /?gen HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
                  b"Content-Length: 4\r\n\r\n")
        assert c.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        c.sendall(b"data")
        resp = b""
        while not resp.endswith(b"0\r\n\r\n"):
            resp += c.recv(4096)
    assert resp.startswith(b"HTTP/1.1 200 OK") and b"4:" in resp and b"data" in resp


def test_head_has_headers_but_no_body(serve):
    _, addr = serve(hello)
    out = raw(addr, b"HEAD /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert b"Content-Length: 8" in head and body == b""


def test_http10_closes_unless_keep_alive_asked(serve):
    _, addr = serve(hello)
    out = raw(addr, b"GET /a HTTP/1.0\r\n\r\n")
    assert b"Connection: close" in out and out.endswith(b"hello /a")
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        first = c.recv(4096)
        assert b"Connection: keep-alive" in first
        c.sendall(b"GET /b HTTP/1.0\r\n\r\n")
        rest = b""
        while chunk := c.recv(4096):
            rest += chunk
        assert rest.endswith(b"hello /b")


def test_app_exception_gives_500_and_the_worker_keeps_serving(serve, caplog):
    def app(environ, start_response):
        if environ["PATH_INFO"] == "/boom":
            raise RuntimeError("boom")
        return hello(environ, start_response)

    _, addr = serve(app)
    out = raw(addr, b"GET /boom HTTP/1.1\r\nHost: h\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 500 Internal Server Error") and b"Connection: close" in out
    assert "app failed on GET /boom" in caplog.text and "RuntimeError: boom" in caplog.text
    assert raw(addr, b"GET /ok HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").endswith(
        b"hello /ok")


def test_exception_after_the_headers_cuts_the_connection(serve):
    def app(environ, start_response):
        start_response("200 OK", [])
        yield b"part one "
        yield b"part two "
        raise RuntimeError("late")

    _, addr = serve(app)
    out = raw(addr, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 OK") and b"part one" in out
    assert not out.endswith(b"0\r\n\r\n")          # no clean end: the client sees the cut


def test_iterable_close_is_always_called(serve):
    closed = threading.Event()

    class Body:
        def __iter__(self):
            yield b"x" * 100

        def close(self):
            closed.set()

    def app(environ, start_response):
        start_response("200 OK", [])
        return Body()

    _, addr = serve(app)
    raw(addr, b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert closed.wait(5)


def test_bad_requests_get_their_status_and_a_close(serve):
    _, addr = serve(hello, limit_request_line=100)
    out = raw(addr, b"GET / HTTP/1.1\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 Bad Request") and b"missing Host" in out
    out = raw(addr, b"GET /" + b"a" * 200 + b" HTTP/1.1\r\nHost: h\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 414 URI Too Long") and b"Connection: close" in out
    out = raw(addr, b"GET / HTTP/2.0\r\nHost: h\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 505")


def test_draining_responses_carry_connection_close(serve):
    loop, addr = serve(hello)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\n")
        first = c.recv(4096)
        assert b"Connection: close" not in first
        loop.drain(5.0)
        deadline = time.monotonic() + 5
        while not loop.draining:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        c.sendall(b"GET /2 HTTP/1.1\r\nHost: h\r\n\r\n")
        rest = b""
        while chunk := c.recv(4096):
            rest += chunk
    assert b"Connection: close" in rest and rest.endswith(b"hello /2")


def wait_closed(sock, timeout: float) -> tuple[bytes, float]:
    """What the server sends until it closes, and when it closed."""
    sock.settimeout(timeout)
    out = b""
    while chunk := sock.recv(4096):
        out += chunk
    return out, time.monotonic()


def test_a_head_not_complete_in_time_gets_408_even_if_trickled(serve):
    _, addr = serve(hello, header_timeout=0.5)
    with socket.create_connection(addr, timeout=10) as c:
        t0 = time.monotonic()
        for b in b"GET / HTTP/1.1\r\nHost: h\r\nX-Slow: ":
            c.sendall(bytes([b]))             # a byte at a time: slowloris
            if time.monotonic() - t0 > 0.3:
                break
        c.sendall(b"a")
        out, t1 = wait_closed(c, 5)
    assert out.startswith(b"HTTP/1.1 408 Request Timeout") and b"Connection: close" in out
    assert t1 - t0 < 2.0


def test_idle_kept_alive_connection_is_closed_after_the_timeout(serve):
    loop, addr = serve(hello, keepalive_timeout=0.5, header_timeout=5)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET /1 HTTP/1.1\r\nHost: h\r\n\r\n")
        first = c.recv(4096)
        t0 = time.monotonic()
        out, t1 = wait_closed(c, 5)
    assert first.endswith(b"hello /1") and out == b""        # closed quietly
    assert 0.4 < t1 - t0 < 2.0
    deadline = time.monotonic() + 5
    while loop.conns:
        assert time.monotonic() < deadline, "the connection is still in the loop"
        time.sleep(0.01)


def test_a_connection_that_keeps_talking_is_not_cut(serve):
    _, addr = serve(hello, keepalive_timeout=0.4, header_timeout=0.4)
    with socket.create_connection(addr, timeout=10) as c:
        for i in range(8):                    # 1.6 s in all, 0.2 s apart
            c.sendall(b"GET /%d HTTP/1.1\r\nHost: h\r\n\r\n" % i)
            assert c.recv(4096).endswith(b"hello /%d" % i)
            time.sleep(0.2)                   # the client's think time (not a wait)


def test_max_connections_pauses_accepting_until_one_closes(serve):
    loop, addr = serve(hello, threads=1)
    loop.max_connections = 2
    a = socket.create_connection(addr, timeout=10)
    b = socket.create_connection(addr, timeout=10)
    for c in (a, b):
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert c.recv(4096).endswith(b"hello /")
    third = socket.create_connection(addr, timeout=10)        # waits in the backlog
    third.sendall(b"GET /3 HTTP/1.1\r\nHost: h\r\n\r\n")
    third.settimeout(0.5)
    with pytest.raises(TimeoutError):
        third.recv(4096)
    a.close()                                                 # room again
    third.settimeout(10)
    assert third.recv(4096).endswith(b"hello /3")
    b.close()
    third.close()


def test_file_wrapper_sends_a_regular_file_with_sendfile(serve, tmp_path, monkeypatch):
    import os as os_mod
    data = os_mod.urandom(3 << 20)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    # sendfile(2) runs in the engine's C (from the loop, issue 21): what
    # shows it is that the file is never read block by block in Python
    from sockherd.worker.wsgi import FileWrapper
    iterated = []
    real = FileWrapper.__iter__

    def spy(self):
        iterated.append(self)
        return real(self)

    monkeypatch.setattr(FileWrapper, "__iter__", spy)

    def app(environ, start_response):
        f = open(path, "rb")
        f.seek(10)                                   # from the current position on
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return environ["wsgi.file_wrapper"](f, 8192)

    _, addr = serve(app)
    conn = http.client.HTTPConnection(*addr, timeout=30)
    for _ in range(2):                               # keep-alive after a sendfile
        conn.request("GET", "/")
        r = conn.getresponse()
        assert r.getheader("Content-Length") == str(len(data) - 10)
        assert r.read() == data[10:]
    conn.request("HEAD", "/")
    r = conn.getresponse()
    assert r.read() == b"" and r.getheader("Content-Length") == str(len(data) - 10)
    conn.close()
    assert not iterated                              # the kernel copied it


def test_file_wrapper_over_a_non_file_is_iterated(serve):
    import io

    def app(environ, start_response):
        start_response("200 OK", [])
        return environ["wsgi.file_wrapper"](io.BytesIO(b"abc" * 10000), 1000)

    _, addr = serve(app)
    conn = http.client.HTTPConnection(*addr, timeout=10)
    conn.request("GET", "/")
    assert conn.getresponse().read() == b"abc" * 10000
    conn.close()


def test_access_log_lines(serve, tmp_path):
    log = tmp_path / "access.log"
    _, addr = serve(hello, access_logfile=str(log),
                    access_log_format='%(h)s "%(r)s" %(s)s %(b)s "%(a)s" %(m)s %(U)s %(q)s %(z)s')
    raw(addr, b"GET /x?y=1 HTTP/1.1\r\nHost: h\r\nUser-Agent: probe/1\r\nConnection: close\r\n\r\n")
    deadline = time.monotonic() + 5
    while "probe/1" not in log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # exactly the format: no logger prefix, no second timestamp
    assert log.read_text() == '127.0.0.1 "GET /x?y=1 HTTP/1.1" 200 8 "probe/1" GET /x y=1 -\n'


from test_http_parser import BAD  # noqa: E402  (the strictness cases, parser level)


@pytest.mark.parametrize("name", sorted(BAD))
def test_each_strictness_case_on_a_real_socket(serve, name):
    """Each malformed request of the parser tests, sent to a real server:
    the status it deserves, Connection: close, and the connection closed;
    the app never runs."""
    ran = []

    def app(environ, start_response):
        ran.append(environ["PATH_INFO"])
        return hello(environ, start_response)

    _, addr = serve(app)
    out = raw(addr, BAD[name])
    assert out.startswith(b"HTTP/1.1 400 Bad Request\r\n"), (name, out[:200])
    assert b"Connection: close" in out
    # a request made valid up to the point of the error may have run (e.g.
    # a chunked body refused in its trailers): never one after it
    assert len(ran) <= 1


def test_client_gone_mid_response_closes_the_iterable_and_leaks_nothing(serve):
    closed = threading.Event()
    sent = []

    class Endless:
        def __iter__(self):
            for i in range(100000):
                sent.append(i)
                yield b"x" * 65536

        def close(self):
            closed.set()

    def app(environ, start_response):
        start_response("200 OK", [])
        return Endless()

    loop, addr = serve(app)
    c = socket.create_connection(addr, timeout=10)
    c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    c.recv(65536)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    c.close()                                        # a reset, mid-response
    assert closed.wait(20), "close() of the iterable was not called"
    deadline = time.monotonic() + 10
    while loop.conns:
        assert time.monotonic() < deadline, "the connection stayed in the loop"
        time.sleep(0.01)
    assert len(sent) < 100000                        # it stopped producing


def test_a_client_that_does_not_read_holds_a_bounded_buffer(serve):
    """§3: a blocked writer never holds more than a bounded buffer: the app
    waits while the client does not read, and everything arrives once it
    reads."""
    from sockherd.worker.stream import HIGH_WATER
    pending = []

    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", str(64 * 65536))])
        for _ in range(64):
            yield b"y" * 65536
            pending.append(environ["sockherd.loop"].conns and
                           max(c.pending for c in environ["sockherd.loop"].conns.values()))

    _, addr = serve(app)
    with socket.create_connection(addr, timeout=30) as c:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        deadline = time.monotonic() + 10
        while len(pending) < 10:                  # the app got some out, then blocks
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert max(pending) <= HIGH_WATER + 65536
        got = 0
        while got < 64 * 65536:
            got += len(c.recv(1 << 20))
    assert max(pending) <= HIGH_WATER + 65536


def test_path_outside_root_path_is_not_put_under_it(serve):
    """Found by the adversarial review of the parser after issue 18: with
    root_path "/app", a request for "/application" (or "/", or an
    absolute-form target with an empty path) reached the app as
    SCRIPT_NAME "/app", PATH_INFO "/application": the URL an app rebuilds
    from them (PEP 3333: SCRIPT_NAME + PATH_INFO) is "/app/application", a
    path the client never asked for, and links and redirects the app makes
    from it point there. A path not under the root is the app's whole path:
    SCRIPT_NAME empty."""
    seen = []

    def app(environ, start_response):
        seen.append((environ["SCRIPT_NAME"], environ["PATH_INFO"]))
        start_response("204 No Content", [])
        return []

    _, addr = serve(app, root_path="/app")
    targets = [b"/app", b"/app/x", b"/application", b"/", b"/APP/x", b"http://h"]
    out = raw(addr, b"".join(b"GET %s HTTP/1.1\r\nHost: h\r\n\r\n" % t for t in targets) +
              b"GET /app/ HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert out.count(b"HTTP/1.1 204") == len(targets) + 1, out
    assert seen == [("/app", ""), ("/app", "/x"), ("", "/application"), ("", "/"),
                    ("", "/APP/x"), ("", "/"), ("/app", "/")]


def test_repeated_cookie_fields_are_joined_with_semicolons(serve):
    """Found by the adversarial review of the parser after issue 18: two
    Cookie fields (an HTTP/2 front end splits cookies into several, RFC
    9113 §8.2.3, and a downgrading proxy may pass them on) were joined with
    a comma, "a=1,b=2": cookie parsers split on ';' only, so the app saw
    one cookie a with the value "1,b=2" and no b. Cookie is the exception
    to RFC 9110 §5.3's comma joining (RFC 6265 §5.4: "; ")."""
    seen = []

    def app(environ, start_response):
        seen.append(environ.get("HTTP_COOKIE"))
        start_response("204 No Content", [])
        return []

    _, addr = serve(app)
    out = raw(addr, b"GET / HTTP/1.1\r\nHost: h\r\nCookie: a=1\r\ncookie: b=2; c=3\r\n"
              b"X-A: 1\r\nX-A: 2\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 204"), out
    assert seen == ["a=1; b=2; c=3"]
