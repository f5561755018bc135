"""Whatever a WSGI app raises or hands back is contained at the call
boundary: the request gets a 500 (nothing sent yet) or its connection
closes (a partial response), the error is logged, and the loop thread
serves on (issue 18 §1, "Loop threads that die"). Each test runs on ONE
loop thread and asks a plain request after the bad ones: a thread that
ended would leave it unanswered (and the fixture checks loop.errors).

Boundaries: the app call, its result's iteration (__iter__, __next__),
its close(), start_response (status, headers, exc_info), the write()
callable, wsgi.input, wsgi.file_wrapper; on the native fast path (a
request whose body is all here) and wsgi.py's slow path (a body still
arriving) alike. Exceptions: Exception and every BaseException an app can
raise (SystemExit, KeyboardInterrupt, GeneratorExit, a custom one)."""
from __future__ import annotations

import socket
import sys

import pytest

from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def serve(serve_wsgi):
    return serve_wsgi                   # conftest.py


class Custom(BaseException):
    """A BaseException of the app's own."""


BASE = [SystemExit, KeyboardInterrupt, GeneratorExit, Custom]
GET = b"GET /bad HTTP/1.1\r\nHost: h\r\n\r\n"


def hello(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello " + environ["PATH_INFO"].encode("latin-1")]


def still_serves(addr, times: int = 1) -> None:
    """The one loop thread answers a plain request (it did not end)."""
    for _ in range(times):
        out = raw(addr, b"GET /ok HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", timeout=5)
        assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"hello /ok"), out


def routed(bad):
    """/bad runs `bad`, anything else is hello."""
    def app(environ, start_response):
        if environ["PATH_INFO"] == "/bad":
            return bad(environ, start_response)
        return hello(environ, start_response)
    return app


def is_500(out: bytes) -> bool:
    return out.startswith(b"HTTP/1.1 500 Internal Server Error") and b"Connection: close" in out


def cut_after_body(out: bytes) -> bool:
    """A partial response: the head and the first chunk, then the close
    with no clean end of the chunked body."""
    return out.startswith(b"HTTP/1.1 200 OK") and b"first" in out and \
        not out.endswith(b"0\r\n\r\n")


# ---- start_response's exc_info ------------------------------------------------------------

def _class_not_instance():
    return (ValueError, ValueError, None)


def _no_exception():
    return sys.exc_info()                    # outside an except block: (None, None, None)


BAD_EXC_INFO = {
    "none-triple": _no_exception,
    "not-a-tuple": lambda: "oops",
    "a-list": lambda: [ValueError, ValueError("x"), None],
    "wrong-length": lambda: (ValueError, ValueError("x")),
    "value-not-an-exception": lambda: (ValueError, "x", None),
    "class-not-instance": _class_not_instance,
    "type-mismatch": lambda: (KeyError, ValueError("x"), None),
    "traceback-not-a-traceback": lambda: (ValueError, ValueError("x"), "tb"),
}


@pytest.mark.parametrize("make", BAD_EXC_INFO.values(), ids=BAD_EXC_INFO.keys())
def test_bad_exc_info_after_body_bytes_closes_and_the_thread_serves_on(serve, make):
    """Issue 18 §1: start_response(status, headers, exc_info) after body
    bytes went out restored exc_info unchecked; (None, None, None) or any
    non-exception corrupted memory and ended the loop thread (four such
    requests stopped a 2x2 server; SIGSEGV in the GC at TERM)."""
    def bad(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        yield b"first"
        yield b"second"
        start_response("500 Oops", [], make())
        yield b"never"

    _, addr = serve(routed(bad))
    for _ in range(5):                        # more than a 2x2 server's four threads
        assert cut_after_body(raw(addr, GET, timeout=5))
    still_serves(addr)


@pytest.mark.parametrize("make", BAD_EXC_INFO.values(), ids=BAD_EXC_INFO.keys())
def test_bad_exc_info_before_the_head_is_a_500(serve, make, caplog):
    """PEP 3333: exc_info must be an exception triple; anything else is an
    app error (500 when nothing was sent), never the status replaced."""
    def bad(environ, start_response):
        start_response("200 OK", [])
        start_response("404 Not Found", [], make())
        return [b"never"]

    _, addr = serve(routed(bad))
    for _ in range(3):
        assert is_500(raw(addr, GET, timeout=5))
    assert "exc_info" in caplog.text
    still_serves(addr)


def test_exc_info_before_the_head_replaces_the_status(serve):
    """PEP 3333: start_response called again with a real exc_info before
    anything went out replaces the status and headers."""
    def bad(environ, start_response):
        start_response("200 OK", [("X-First", "1")])
        try:
            raise ValueError("handled")
        except ValueError:
            start_response("503 Service Unavailable", [("X-Second", "1")], sys.exc_info())
        return [b"sorry"]

    _, addr = serve(routed(bad))
    out = raw(addr, b"GET /bad HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", timeout=5)
    assert out.startswith(b"HTTP/1.1 503 Service Unavailable") and out.endswith(b"sorry")
    assert b"X-Second: 1" in out and b"X-First" not in out


@pytest.mark.parametrize("exc", BASE + [ValueError])
def test_real_exc_info_after_body_bytes_reraises_and_closes(serve, exc):
    """A valid exc_info after body bytes is raised again (PEP 3333) and
    handled as the app's error, whatever its class: the connection closes."""
    def bad(environ, start_response):
        start_response("200 OK", [])
        yield b"first"
        yield b"second"                       # the first chunk goes out
        try:
            raise exc("late")
        except BaseException:
            start_response("500 Oops", [], sys.exc_info())
        yield b"never"

    _, addr = serve(routed(bad))
    for _ in range(3):
        assert cut_after_body(raw(addr, GET, timeout=5))
    still_serves(addr)


# ---- BaseException at each boundary ---------------------------------------------------------

def _raise(exc):
    raise exc("from the app")


def at_call(exc):
    def bad(environ, start_response):
        _raise(exc)
    return bad


def at_call_after_start(exc):
    def bad(environ, start_response):
        start_response("200 OK", [])
        _raise(exc)
    return bad


def at_iter(exc):
    class Body:
        def __iter__(self):
            _raise(exc)

    def bad(environ, start_response):
        start_response("200 OK", [])
        return Body()
    return bad


def at_first_next(exc):
    class Body:
        def __iter__(self):
            return self

        def __next__(self):
            _raise(exc)

    def bad(environ, start_response):
        start_response("200 OK", [])
        return Body()
    return bad


def at_write(exc):
    """Raising while holding the write callable, before using it. (A
    write() sends the head at once, PEP 3333, empty or not, so an exception
    after one is an 'after body bytes' case.)"""
    def bad(environ, start_response):
        write = start_response("200 OK", [])
        assert callable(write)
        _raise(exc)
    return bad


def at_status_str(exc):
    class Status(str):
        def __repr__(self):
            _raise(exc)

    def bad(environ, start_response):
        start_response(Status("bad status"), [])     # the error message's repr raises
        return [b"never"]
    return bad


def at_headers_iter(exc):
    class Headers:
        def __iter__(self):
            _raise(exc)

    def bad(environ, start_response):
        start_response("200 OK", Headers())
        return [b"never"]
    return bad


def at_input(exc):
    def bad(environ, start_response):
        environ["wsgi.input"].read("not a size")      # TypeError on either path
        _raise(exc)
    return bad


def at_file_wrapper_fileno(exc):
    class File:
        def fileno(self):
            _raise(exc)

        def read(self, n):
            return b""

    def bad(environ, start_response):
        start_response("200 OK", [])
        return environ["wsgi.file_wrapper"](File())
    return bad


def at_file_wrapper_read(exc):
    class File:
        def read(self, n):
            _raise(exc)

    def bad(environ, start_response):
        start_response("200 OK", [])
        return environ["wsgi.file_wrapper"](File())
    return bad


BEFORE_THE_HEAD = [at_call, at_call_after_start, at_iter, at_first_next, at_write,
                   at_status_str, at_headers_iter, at_file_wrapper_fileno, at_file_wrapper_read]


# (where, exc) pairs: fileno() raising ValueError (or OSError) means "no
# descriptor" by design (io.UnsupportedOperation): the file is iterated
BEFORE_CASES = [pytest.param(w, e, id=f"{w.__name__}-{e.__name__}")
                for w in BEFORE_THE_HEAD for e in BASE + [ValueError]
                if not (w is at_file_wrapper_fileno and e is ValueError)]


@pytest.mark.parametrize("where, exc", BEFORE_CASES)
def test_an_exception_before_the_head_is_a_500_on_the_fast_path(serve, where, exc, caplog):
    """Issue 18 §1: SystemExit or KeyboardInterrupt raised by the app ended
    the loop thread, its connection neither closed nor timed (the client
    waited forever). Now any exception is the app's error: 500, logged."""
    _, addr = serve(routed(where(exc)))
    for _ in range(2):
        assert is_500(raw(addr, GET, timeout=5))
    assert "app failed on GET /bad" in caplog.text
    still_serves(addr)


@pytest.mark.parametrize("exc", BASE + [ValueError], ids=lambda e: e.__name__)
def test_an_exception_after_body_bytes_closes_the_connection(serve, exc):
    """The same after body bytes went out: the connection closes mid-body."""
    def bad(environ, start_response):
        start_response("200 OK", [])
        yield b"first"
        yield b"second"
        _raise(exc)

    _, addr = serve(routed(bad))
    for _ in range(2):
        assert cut_after_body(raw(addr, GET, timeout=5))
    still_serves(addr)


@pytest.mark.parametrize("exc", BASE + [ValueError], ids=lambda e: e.__name__)
def test_an_exception_in_close_is_logged_and_the_response_stands(serve, exc, caplog):
    """close() of the result raising: the response already framed stands
    (kept alive), the error is logged."""
    class Body:
        def __iter__(self):
            yield b"whole"

        def close(self):
            _raise(exc)

    def bad(environ, start_response):
        start_response("200 OK", [])
        return Body()

    _, addr = serve(routed(bad))
    with socket.create_connection(addr, timeout=5) as c:
        for _ in range(2):
            c.sendall(GET)
            got = b""
            # a generator's one block goes out as it comes (chunked)
            while not got.endswith(b"\r\n0\r\n\r\n"):
                chunk = c.recv(65536)
                assert chunk, got
                got += chunk
            assert got.startswith(b"HTTP/1.1 200 OK") and b"whole" in got
    assert "close() of the app's response failed" in caplog.text
    still_serves(addr)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("exc", BASE + [ValueError], ids=lambda e: e.__name__)
def test_result_whose_del_raises_is_harmless(serve, exc):
    """__del__ raising when the engine drops the result: unraisable, never
    the loop thread's end."""
    class Body(list):
        def __del__(self):
            _raise(exc)

    def bad(environ, start_response):
        start_response("200 OK", [])
        return Body([b"body"])

    _, addr = serve(routed(bad))
    for _ in range(2):
        out = raw(addr, b"GET /bad HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", timeout=5)
        assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"body")
    still_serves(addr)


# ---- the slow path (wsgi.py: a body still arriving) -----------------------------------------

def slow_request(addr, wait_continue: bool = False) -> bytes:
    """A POST whose body comes after the head: the engine serves it on the
    slow path (wsgi.py's serve_slow), which calls the app from Python."""
    with socket.create_connection(addr, timeout=5) as c:
        if wait_continue:
            c.sendall(b"POST /bad HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n"
                      b"Expect: 100-continue\r\n\r\n")
        else:
            # half the body: the rest never comes (the app fails first)
            c.sendall(b"POST /bad HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nab")
        out = b""
        while True:
            try:
                chunk = c.recv(65536)
            except ConnectionResetError:
                return out
            if not chunk:
                return out
            out += chunk


def at_bad_exc_info(exc):
    """start_response given a non-exception exc_info (exc is not raised:
    the same TypeError whatever the parametrisation)."""
    def bad(environ, start_response):
        start_response("200 OK", [])
        start_response("500 Oops", [], sys.exc_info())     # (None, None, None)
        return [b"never"]
    return bad


@pytest.mark.parametrize("where", [at_call, at_call_after_start, at_first_next, at_input,
                                   at_bad_exc_info], ids=lambda f: f.__name__)
@pytest.mark.parametrize("exc", BASE + [ValueError], ids=lambda e: e.__name__)
@pytest.mark.parametrize("wait_continue", [False, True], ids=["body-arriving", "expect-100"])
def test_an_exception_on_the_slow_path_is_a_500(serve, where, exc, wait_continue):
    """The slow path calls the same respond() from Python (serve_slow): a
    BaseException there ended the loop thread too."""
    # the slow path: every body still arriving streams
    _, addr = serve(routed(where(exc)), body_buffer=0)
    for _ in range(2):
        assert is_500(slow_request(addr, wait_continue))
    still_serves(addr)


def test_an_app_that_empties_its_environ_still_gets_its_error_logged(serve, caplog):
    """Found trying: the error report read environ["REQUEST_METHOD"] after
    the app ran; an app that cleared its environ lost its own error's log
    line (a KeyError in the report instead)."""
    def bad(environ, start_response):
        environ.clear()
        raise ValueError("after clearing")

    _, addr = serve(routed(bad))
    assert is_500(raw(addr, GET, timeout=5))
    assert "app failed on None None" in caplog.text and "ValueError: after clearing" in \
        caplog.text
    still_serves(addr)


@pytest.mark.parametrize("status", [-5, 200, 999, 2 ** 70])
def test_a_bad_body_error_the_app_raises_is_a_4xx(serve, status):
    """Found trying: a BadBody the app raised itself went out with its own
    status, whatever it was ("HTTP/1.1 -5 Error")."""
    from sockherd.worker.wsgi import BadBody

    def bad(environ, start_response):
        raise BadBody(status, "the app's own")

    _, addr = serve(routed(bad))
    out = raw(addr, GET, timeout=5)
    assert out.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Connection: close" in out, out
    still_serves(addr)


def test_a_wsgi_input_kept_past_its_request_reads_nothing(serve):
    """Found trying: a slow-path wsgi.input the app kept and read during a
    later request (of another client) waited body_timeout on the loop
    thread, polling and reading the first connection's fd number, which
    may be another client's socket by then: the thread stuck, the other
    requests unanswered. Now it reads b"" once its request ended."""
    kept = {}

    def app(environ, start_response):
        if environ["PATH_INFO"] == "/keep":
            kept["input"] = environ["wsgi.input"]      # the body is never read
        elif environ["PATH_INFO"] == "/read":
            start_response("200 OK", [])
            return [b"read:" + kept["input"].read(100)]
        return hello(environ, start_response)

    # the slow path: every body still arriving streams
    _, addr = serve(app, body_timeout=30, body_buffer=0)
    out = raw(addr, b"POST /keep HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n"
                    b"Expect: 100-continue\r\nConnection: close\r\n\r\n", timeout=5)
    assert out.startswith(b"HTTP/1.1 200 OK")
    out = raw(addr, b"GET /read HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", timeout=5)
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"read:"), out
    still_serves(addr)


@pytest.mark.parametrize("exc", BASE + [ValueError], ids=lambda e: e.__name__)
def test_a_result_whose_len_raises_is_a_500_and_a_status_whose_str_raises_is_served(serve, exc):
    """__str__ of the status is never asked (the engine reads the status's
    characters): raising there changes nothing. __len__ of the result is
    asked (a one-item body is sent whole with a Content-Length, PEP 3333
    allows it): raising there is the app's error, a 500, and the thread
    serves on."""
    class Body:
        def __len__(self):
            _raise(exc)

        def __iter__(self):
            yield b"body"

    class Status(str):
        def __str__(self):
            _raise(exc)

    def bad(environ, start_response):
        start_response(Status("200 OK"), [])
        return [b"body"] if environ["QUERY_STRING"] == "status" else Body()

    _, addr = serve(routed(bad))
    for _ in range(2):
        out = raw(addr, b"GET /bad?status HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", timeout=5)
        assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"body"), out
        out = raw(addr, b"GET /bad HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", timeout=5)
        assert is_500(out), out
    still_serves(addr)


@pytest.mark.parametrize("exc", BASE, ids=lambda e: e.__name__)
def test_two_loop_threads_with_siblings_contain_it_too(serve, exc):
    """The relieved loop (a thread with siblings leaves its batch and
    enters each fd again, engine.c) takes its own branch in the turn:
    the same containment there, on every thread."""
    loop, addr = serve(routed(at_call(exc)), threads=2)
    for _ in range(6):
        assert is_500(raw(addr, GET, timeout=5))
    still_serves(addr, times=4)
    assert loop.threads_alive == 2


@pytest.mark.parametrize("exc", BASE + [ValueError], ids=lambda e: e.__name__)
def test_a_regular_file_whose_tell_raises_is_a_500(serve, exc, tmp_path):
    """wsgi.file_wrapper over a regular file goes to sendfile
    (wsgi.py's sendfile_response, called from C): its tell() raising
    before the head went out is the app's error."""
    path = tmp_path / "f"
    path.write_bytes(b"file body")

    def bad(environ, start_response):
        f = open(path, "rb")

        class File:
            fileno = f.fileno
            read = f.read
            close = f.close

            def tell(self):
                _raise(exc)

        start_response("200 OK", [])
        return environ["wsgi.file_wrapper"](File())

    _, addr = serve(routed(bad))
    for _ in range(2):
        assert is_500(raw(addr, GET, timeout=5))
    still_serves(addr)


@pytest.mark.parametrize("sent", [6, 10, 2**64 - 1])
def test_an_app_that_sets_sent_on_its_start_response_cannot_overread(serve, sent):
    """Review finding: start_response's `sent` (body bytes sent, writable
    for wsgi.py's sendfile) set by the app past its Content-Length made the
    engine's "never past what we announced" cut a negative length: a
    memcpy far past the body and the whole worker died of SIGSEGV. The
    response is cut at what was announced, the connection closes, the loop
    thread serves on."""
    def bad(environ, start_response):
        start_response("200 OK", [("Content-Length", "5")])
        start_response.sent = sent
        return [b"x"]

    _, addr = serve(routed(bad))
    out = raw(addr, GET, timeout=5)
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"\r\n\r\n"), out
    still_serves(addr)
