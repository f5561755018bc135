"""The native request parser (worker/native: llhttp in strict mode plus our
checks) and the environ it builds: every strictness case of RFC 9112/9110
that the HTTP issue lists, the limits, pipelining, chunked bodies with
trailers, and the same results whatever the byte boundaries of the input."""
from __future__ import annotations

import os

import pytest
from hypothesis import given, settings, strategies as st


def _module():
    """The extension: as installed, or the sanitizer build that conftest.py
    put in its place (SOCKHERD_HTTP_MODULE, from test_http_asan.py)."""
    from sockherd.worker import _http
    if os.environ.get("SOCKHERD_HTTP_MODULE"):
        assert _http.__file__ == os.environ["SOCKHERD_HTTP_MODULE"], _http.__file__
    return _http


_http = _module()
HttpError, RequestParser = _http.HttpError, _http.RequestParser

pytestmark = pytest.mark.timeout(60)

BASE = {"SCRIPT_NAME": "", "wsgi.url_scheme": "http"}


def parse(data: bytes, **limits):
    """All requests in data: [(environ, body, keep_alive)], or the HttpError."""
    p = RequestParser(**limits)
    p.feed(data)
    out = []
    while True:
        env = p.next_request(BASE)
        if env is None:
            return out
        body = b""
        while not p.body_done:
            chunk = p.read_body()
            if not chunk and not p.body_done:
                return out + [(env, body, None)]       # body incomplete
            body += chunk
        keep = p.keep_alive
        out.append((env, body, keep))
        if not p.finish():
            return out


def refused(data: bytes, **limits) -> tuple[int, str]:
    with pytest.raises(HttpError) as exc:
        parse(data, **limits)
    return exc.value.args


# ---- environ -----------------------------------------------------------------

def test_environ_of_a_request():
    [(env, body, keep)] = parse(
        b"GET /a%20b/%E2%82%AC?x=1&y=%20#frag HTTP/1.1\r\nHost: example.com:8080\r\n"
        b"Content-Type: text/plain\r\nContent-Length: 0\r\nX-Foo: a  \r\nx-foo: b\r\n"
        b"X_Foo: spoof\r\nCookie: a=1\r\n\r\n")
    assert env["REQUEST_METHOD"] == "GET"
    assert env["PATH_INFO"] == "/a b/\xe2\x82\xac"          # percent-decoded bytes as latin-1
    assert env["QUERY_STRING"] == "x=1&y=%20"                # raw, no fragment
    assert env["RAW_URI"] == env["REQUEST_URI"] == "/a%20b/%E2%82%AC?x=1&y=%20#frag"
    assert env["SERVER_PROTOCOL"] == "HTTP/1.1"
    assert env["HTTP_HOST"] == "example.com:8080"
    assert env["CONTENT_TYPE"] == "text/plain" and env["CONTENT_LENGTH"] == "0"
    assert "HTTP_CONTENT_TYPE" not in env and "HTTP_CONTENT_LENGTH" not in env
    assert env["HTTP_X_FOO"] == "a,b"                        # joined, trailing OWS gone
    assert "spoof" not in env.values()                       # '_' names dropped
    assert env["HTTP_COOKIE"] == "a=1" and env["wsgi.url_scheme"] == "http"
    assert body == b"" and keep is True


def test_script_name_prefix_is_not_in_path_info():
    p = RequestParser(script_name="/app")
    p.feed(b"GET /app/x HTTP/1.1\r\nHost: h\r\n\r\nGET /application HTTP/1.1\r\nHost: h\r\n\r\n")
    assert p.next_request({"SCRIPT_NAME": "/app"})["PATH_INFO"] == "/x"
    assert p.finish()
    assert p.next_request({"SCRIPT_NAME": "/app"})["PATH_INFO"] == "/application"


def test_absolute_form_target():
    [(env, _, _)] = parse(b"GET http://example.com/p?q=1 HTTP/1.1\r\nHost: example.com\r\n\r\n")
    assert env["PATH_INFO"] == "/p" and env["QUERY_STRING"] == "q=1"


def test_http10_default_close_and_keep_alive_on_request():
    [(_, _, keep)] = parse(b"GET / HTTP/1.0\r\n\r\n")
    assert keep is False
    reqs = parse(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /2 HTTP/1.0\r\n\r\n")
    assert [e["PATH_INFO"] for e, _, _ in reqs] == ["/", "/2"] and reqs[0][2] is True


def test_pipelined_requests_in_order_with_bodies():
    data = (b"POST /1 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
            b"POST /2 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\nde\r\n1;ext=1\r\nf\r\n0\r\nX-Trailer: t\r\n\r\n"
            b"GET /3 HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    reqs = parse(data)
    assert [(e["PATH_INFO"], b, k) for e, b, k in reqs] == [
        ("/1", b"abc", True), ("/2", b"def", True), ("/3", b"", False)]
    assert "HTTP_X_TRAILER" not in reqs[1][0]                # trailers never merged


def test_expect_continue_is_reported_before_the_body():
    p = RequestParser()
    p.feed(b"PUT /u HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
    env = p.next_request(BASE)
    assert p.expect_continue and p.state == "body" and p.read_body() == b""
    p.feed(b"data")
    assert p.read_body() == b"data" and p.body_done and env["HTTP_EXPECT"] == "100-continue"


# ---- strictness (RFC 9112/9110) ----------------------------------------------------

BAD = {
    "content-length with transfer-encoding":
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    "transfer-encoding not ending in chunked":
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
    "transfer-encoding on http/1.0":
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "signed content-length": b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +3\r\n\r\nabc",
    "negative content-length": b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -3\r\n\r\n",
    "overflowing content-length":
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    "two content-lengths": b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n"
                           b"Content-Length: 2\r\n\r\nab",
    "bad chunk size": b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "overflowing chunk size": b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                              b"fffffffffffffffffff\r\n",
    "missing crlf after chunk data": b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: "
                                     b"chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
    "content-length in trailers": b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked"
                                  b"\r\n\r\n1\r\na\r\n0\r\nContent-Length: 5\r\n\r\n",
    "transfer-encoding in trailers": b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: "
                                     b"chunked\r\n\r\n0\r\nTransfer-Encoding: x\r\n\r\n",
    "host in trailers": b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"0\r\nhost: evil\r\n\r\n",
    "missing host on http/1.1": b"GET / HTTP/1.1\r\n\r\n",
    "repeated host": b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "bare lf in a field line": b"GET / HTTP/1.1\r\nHost: h\nX: y\r\n\r\n",
    "bare cr in a field value": b"GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n",
    "nul in a field value": b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x00b\r\n\r\n",
    "whitespace before the colon": b"GET / HTTP/1.1\r\nHost : h\r\n\r\n",
    "obsolete line folding": b"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n",
    "obsolete line folding with a tab": b"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n\tb\r\n\r\n",
    "invalid method": b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n",
    "invalid field name": b"GET / HTTP/1.1\r\nHost: h\r\nX@Y: 1\r\n\r\n",
    "garbage": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_requests_are_refused_with_400(name):
    status, reason = refused(BAD[name])
    assert status == 400 and reason, (name, reason)


@pytest.mark.parametrize("line", [b"GET / HTTP/2.0", b"GET / HTTP/1.2", b"GET / HTTP/0.9"])
def test_other_versions_get_505(line):
    assert refused(line + b"\r\nHost: h\r\n\r\n")[0] == 505


def test_http2_preface_gets_505():
    assert refused(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")[0] == 505


# ---- limits ------------------------------------------------------------------------

def test_request_line_limit_414():
    # the whole line counts, CRLF excluded (gunicorn's limit_request_line)
    ok = b"GET /" + b"a" * 86 + b" HTTP/1.1\r\nHost: h\r\n\r\n"
    assert parse(ok, max_line=100)
    assert refused(b"GET /" + b"a" * 87 + b" HTTP/1.1\r\nHost: h\r\n\r\n", max_line=100)[0] == 414


def test_field_size_and_count_limits_431():
    big = b"GET / HTTP/1.1\r\nHost: h\r\nX: " + b"v" * 200 + b"\r\n\r\n"
    assert refused(big, max_field_size=100)[0] == 431
    # one field line each (whitespace and CRLF included), not all together
    fits = b"GET / HTTP/1.1\r\nHost: h\r\n" + b"X: " + b"v" * 95 + b"\r\nY:" + b" " * 95 + b"y\r\n"
    assert parse(fits + b"\r\n", max_field_size=100)
    assert refused(fits.replace(b"Y:", b"Y: ") + b"\r\n", max_field_size=100)[0] == 431
    many = b"GET / HTTP/1.1\r\nHost: h\r\n" + b"".join(b"X%d: 1\r\n" % i for i in range(20))
    assert refused(many + b"\r\n", max_headers=10)[0] == 431
    assert parse(many + b"\r\n", max_headers=21)


def test_body_limit_413_declared_and_chunked():
    assert refused(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n",
                   max_body=10)[0] == 413
    chunked = (b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n")
    assert refused(chunked, max_body=10)[0] == 413
    assert parse(chunked, max_body=16)[0][1] == b"1234567812345678"


def test_a_refused_parser_stays_refused():
    p = RequestParser()
    p.feed(b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(HttpError):
        p.next_request(BASE)
    p.feed(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
    with pytest.raises(HttpError):
        p.next_request(BASE)


# ---- byte boundaries ------------------------------------------------------------------

STREAM = (b"POST /up?x=1 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
          b"Content-Type: a/b\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\nT: 1\r\n\r\n"
          b"GET /b HTTP/1.1\r\nHost: h\r\nCookie: c=1\r\n\r\n"
          b"PUT /c HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nxyz")


def feed_pieces(data: bytes, cuts: list[int], view, out: list) -> None:
    """Feeds data to one RequestParser cut at cuts, appending view(environ,
    body) to out for each request whose body it finished, in order; stops
    after a request that closes. Raises the parser's HttpError."""
    p, env, body = RequestParser(), None, b""
    pieces, last = [], 0
    for c in sorted(set(x for x in cuts if 0 < x < len(data))) + [len(data)]:
        pieces.append(data[last:c])
        last = c
    for piece in pieces:
        p.feed(piece)
        while True:
            if env is None:
                env = p.next_request(BASE)
                if env is None:
                    break
            while not p.body_done and (chunk := p.read_body()):
                body += chunk
            if not p.body_done:
                break
            out.append(view(env, body))
            env, body = None, b""
            if not p.finish():
                return


def framed(data: bytes, cuts: list[int], view) -> tuple[list, str]:
    """What one RequestParser frames from data fed cut at cuts (feed_pieces),
    and 'refused' (HttpError) or 'open' (waiting for more, or stopped after
    a request that closes)."""
    out: list = []
    try:
        feed_pieces(data, cuts, view, out)
    except HttpError:
        return out, "refused"
    return out, "open"


def split_parse(data: bytes, cuts: list[int]):
    out, how = framed(data, cuts, lambda env, body: (env["REQUEST_METHOD"], env["PATH_INFO"],
                                                     env.get("HTTP_COOKIE"), body))
    assert how == "open"
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=40))
def test_any_split_gives_the_same_requests(cuts):
    assert split_parse(STREAM, cuts) == [("POST", "/up", None, b"hello world"),
                                         ("GET", "/b", "c=1", b""), ("PUT", "/c", None, b"xyz")]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_is_refused_or_incomplete_never_a_crash(data):
    try:
        parse(data)
    except HttpError as exc:
        assert 400 <= exc.args[0] <= 505


@pytest.mark.parametrize("cut", range(1, 40))
def test_obsolete_folding_is_refused_at_any_split(cut):
    data = b"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n\tb\r\n\r\n"
    p = RequestParser()
    with pytest.raises(HttpError):
        p.feed(data[:cut])
        assert p.next_request(BASE) is None
        p.feed(data[cut:])
        p.next_request(BASE)


# ---- the response head (start_response's checks, in C) ------------------------------

def test_response_head_serialises_and_drops_hop_by_hop():
    prefix, length, close = _http.response_head(
        "200 OK", [("Content-Type", "text/plain"), ("Content-Length", "13"),
                   ("Connection", "close"), ("Transfer-Encoding", "chunked"),
                   ("X-A", "caf\xe9\tok")])
    assert prefix == (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n"
                      b"X-A: caf\xe9\tok\r\n")
    assert length == 13 and close is True
    prefix, length, close = _http.response_head("204 No Content", [("Content-Length", "3")])
    assert prefix == b"HTTP/1.1 204 No Content\r\n" and length == -1 and close is False
    assert _http.response_head("304 Not Modified", [("Content-Length", "3")])[1] == 3


@pytest.mark.parametrize("status,headers", [
    ("200 OK\r\nSet-Cookie: x=1", []), ("2000", []), ("200", []), ("600 Nope", []),
    ("200 OK", [("X Y", "1")]), ("200 OK", [("", "1")]), ("200 OK", [("X:Y", "1")]),
    ("200 OK", [("X", "a\r\nb")]), ("200 OK", [("X", "a\x00b")]), ("200 OK", [("X", "\u20ac")]),
    ("200 OK", [("Content-Length", "1_0")]), ("200 OK", [("Content-Length", "")]),
    ("200 OK", [("Content-Length", "1"), ("content-length", "1")]),
    ("200 OK", [("X", b"bytes")]), ("200 OK", [("X",)]), ("200 OK", "not a list"),
])
def test_response_head_refuses_what_would_split_or_corrupt_a_response(status, headers):
    with pytest.raises((ValueError, TypeError)):
        _http.response_head(status, headers)
