"""Request smuggling and loose request syntax, on the wire (issue 18 §2).

Each test sends a request the server must refuse, followed on the same
connection by a second request, `GET /smuggled`: the server must answer the
first with the status RFC 9112 asks for, close the connection, and never
serve the second (a front proxy that frames the bytes differently would see
it as part of the first request: that is the smuggling). The cases that
llhttp 8.1 in strict mode refused already are kept as guards."""
from __future__ import annotations

import re
import socket
import time

import pytest

pytestmark = pytest.mark.timeout(60)

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n"
CHUNKED = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"


def exchange(addr, data: bytes, timeout: float = 10.0) -> tuple[list[int], bytes, bool]:
    """Sends data, reads until the server closes (or the deadline): the
    statuses of the responses, all bytes read, whether the server closed."""
    deadline = time.monotonic() + timeout
    out = b""
    with socket.create_connection(addr, timeout=timeout) as c:
        c.sendall(data)
        closed = False
        while time.monotonic() < deadline:
            c.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = c.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                closed = True
                break
            out += chunk
    return [int(s) for s in re.findall(rb"^HTTP/1\.1 (\d{3}) ", out, re.M)], out, closed


@pytest.fixture
def served(serve_wsgi):
    """(addr, paths): a hello app recording each PATH_INFO it serves."""
    paths = []

    def app(environ, start_response):
        paths.append(environ["PATH_INFO"])
        body = environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok " + body + b"\n"]

    _, addr = serve_wsgi(app)
    return addr, paths


def refused_on_wire(served, data: bytes, status: int) -> bytes:
    addr, paths = served
    statuses, out, closed = exchange(addr, data + SMUGGLED)
    assert statuses == [status], out
    assert closed, "the connection must close after a refusal"
    assert "/smuggled" not in paths, paths
    return out


# (id, request, status, RFC 9112 section)
CASES = [
    # §6.1/§6.3: Transfer-Encoding with Content-Length is refused, an empty
    # one included (it was framed by Content-Length)
    ("empty-te-with-cl", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\n"
     b"Content-Length: 3\r\n\r\nabc", 400, "6.1, 6.3"),
    ("empty-te-with-cl-http10", b"POST / HTTP/1.0\r\nTransfer-Encoding: \r\n"
     b"Content-Length: 3\r\n\r\nabc", 400, "6.1"),
    ("empty-te", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\n\r\n", 400, "6.1"),
    ("te-chunked-with-cl", CHUNKED[:-2] + b"Content-Length: 3\r\n\r\n0\r\n\r\n", 400, "6.1"),
    # §7.1: the last chunk and the trailer section end in CRLF, never bare LF
    ("last-chunk-bare-lf", CHUNKED + b"0\r\n\n", 400, "7.1"),
    ("trailer-bare-lf", CHUNKED + b"0\r\nX: 1\r\n\n", 400, "7.1"),
    ("trailer-line-bare-lf", CHUNKED + b"0\r\nX: 1\n\r\n", 400, "7.1"),
    ("chunk-size-bare-lf", CHUNKED + b"1\nx\r\n0\r\n\r\n", 400, "7.1"),
    ("chunk-ext-bare-lf", CHUNKED + b"1;a\nx\r\n0\r\n\r\n", 400, "7.1.1"),
    ("last-chunk-size-bare-lf", CHUNKED + b"1\r\nx\r\n0\n\r\n", 400, "7.1"),
    # §2.2: bare LF ends neither the request line nor a field line nor the head
    ("request-line-bare-lf", b"GET / HTTP/1.1\nHost: h\r\n\r\n", 400, "2.2"),
    ("field-line-bare-lf", b"GET / HTTP/1.1\r\nHost: h\n\r\n", 400, "2.2"),
    ("head-end-bare-lf", b"GET / HTTP/1.1\r\nHost: h\r\n\n", 400, "2.2"),
    ("leading-empty-line-bare-lf", b"\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", 400, "2.2"),
    # §3: one SP between the three parts of the request line, a version always
    ("request-line-double-sp", b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 400, "3"),
    ("request-line-double-sp-2", b"GET /  HTTP/1.1\r\nHost: h\r\n\r\n", 400, "3"),
    ("request-line-http09", b"GET /\r\nHost: h\r\n\r\n", 400, "3, 2.3"),
    ("request-line-http09-bare", b"GET /\r\n\r\n", 400, "3, 2.3"),
    # llhttp issue 877: HTTP/0.9 line ended by a bare LF, then a framed body
    ("http09-bare-lf-with-body", b"GET /x\nHost: a\r\nContent-Length: 5\r\n\r\nhello", 400,
     "3, 2.2"),
    # §6.1: a coding we do not decode is 501; chunked not last, or twice, 400
    ("te-gzip-chunked", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n"
     b"\r\n0\r\n\r\n", 501, "6.1"),
    ("te-two-fields-gzip-chunked", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501, "6.1"),
    ("te-chunked-twice", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "6.1"),
    ("te-chunked-chunked", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked"
     b"\r\n\r\n0\r\n\r\n", 400, "6.1"),
    ("te-chunked-not-last", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip"
     b"\r\n\r\n0\r\n\r\n", 400, "6.3"),
    ("te-gzip", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", 400, "6.3"),
    ("te-chunked-comma", b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked,\r\n"
     b"\r\n0\r\n\r\n", 400, "6.1"),
    ("te-http10", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "6.1"),
    # §3.2: Host is one uri-host [":" port], never a list
    ("host-list", b"GET / HTTP/1.1\r\nHost: a, b\r\n\r\n", 400, "3.2"),
    ("host-list-no-space", b"GET / HTTP/1.1\r\nHost: a,b\r\n\r\n", 400, "3.2"),
    ("host-space", b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "3.2"),
    ("host-port-letters", b"GET / HTTP/1.1\r\nHost: a:b\r\n\r\n", 400, "3.2"),
    ("host-two-ports", b"GET / HTTP/1.1\r\nHost: a:1:2\r\n\r\n", 400, "3.2"),
    ("host-userinfo", b"GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", 400, "3.2"),
    ("absolute-userinfo", b"GET http://u@a/ HTTP/1.1\r\nHost: a\r\n\r\n", 400, "3.2.2; RFC 9110 4.2.4"),
    ("star-prefixed", b"OPTIONS *0 HTTP/1.1\r\nHost: a\r\n\r\n", 400, "3.2.4"),
    ("bare-cr-before-request", b"\rGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400, "2.2"),
    ("repeated-content-type", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: a/b\r\n"
     b"Content-Type: c/d\r\nContent-Length: 0\r\n\r\n", 400, "RFC 9110 8.3, 5.3"),
    ("host-v6-unclosed", b"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", 400, "3.2"),
    # §3.2.2: absolute-form of http(s), with a host
    ("absolute-ftp", b"GET ftp://a/x HTTP/1.1\r\nHost: h\r\n\r\n", 400, "3.2.2"),
    ("absolute-no-host", b"GET http:///x HTTP/1.1\r\nHost: h\r\n\r\n", 400, "3.2.2"),
    ("absolute-bad-port", b"GET http://a:b/x HTTP/1.1\r\nHost: h\r\n\r\n", 400, "3.2.2"),
    ("host-twice", b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400, "3.2"),
    ("host-missing", b"GET / HTTP/1.1\r\n\r\n", 400, "3.2"),
    # §3.2.4: asterisk-form only with OPTIONS
    ("asterisk-get", b"GET * HTTP/1.1\r\nHost: h\r\n\r\n", 400, "3.2.4"),
    ("asterisk-post", b"POST * HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n", 400, "3.2.4"),
    # §6.3 / RFC 9110 §8.6: Content-Length is 1*DIGIT, one value
    ("cl-plus", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +3\r\n\r\nabc", 400, "6.3"),
    ("cl-minus", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -3\r\n\r\nabc", 400, "6.3"),
    ("cl-inner-space", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1 3\r\n\r\nabc", 400,
     "6.3"),
    ("cl-list", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3, 3\r\n\r\nabc", 400, "6.3"),
    ("cl-twice", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n"
     b"\r\nabc", 400, "6.3"),
    ("cl-hex", b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0x3\r\n\r\nabc", 400, "6.3"),
    # §5.1, §5.2, §2.2: no whitespace before the colon, no obs-fold, no
    # whitespace line before the first field, no bare CR or NUL
    ("space-before-colon", b"GET / HTTP/1.1\r\nHost: h\r\nX : 1\r\n\r\n", 400, "5.1"),
    ("obs-fold", b"GET / HTTP/1.1\r\nHost: h\r\nX: 1\r\n 2\r\n\r\n", 400, "5.2"),
    ("ws-before-first-field", b"GET / HTTP/1.1\r\n Host: h\r\n\r\n", 400, "2.2"),
    ("bare-cr-in-value", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n", 400, "2.2"),
    ("bare-cr-in-line", b"GET / HTTP/1.1\rHost: h\r\n\r\n", 400, "2.2"),
    ("nul-in-value", b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x00b\r\n\r\n", 400, "5.5"),
    ("nul-in-target", b"GET /\x00 HTTP/1.1\r\nHost: h\r\n\r\n", 400, "3.2"),
    # §7.1.1: chunk extensions: a quoted string may not hold CR or LF
    ("chunk-ext-quoted-crlf", CHUNKED + b"1;a=\"x\r\n\"\r\nx\r\n0\r\n\r\n", 400, "7.1.1"),
    ("chunk-size-space", CHUNKED + b"1 \r\nx\r\n0\r\n\r\n", 400, "7.1"),
    ("chunk-size-plus", CHUNKED + b"+1\r\nx\r\n0\r\n\r\n", 400, "7.1"),
    ("chunk-data-bare-lf", CHUNKED + b"1\r\nx\n0\r\n\r\n", 400, "7.1"),
    # §7.1.2: no framing field in the trailer section
    ("trailer-cl", CHUNKED + b"0\r\nContent-Length: 5\r\n\r\n", 400, "7.1.2"),
    ("trailer-te", CHUNKED + b"0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "7.1.2"),
    ("trailer-obs-fold", CHUNKED + b"0\r\nX: 1\r\n\tY\r\n\r\n", 400, "5.2, 7.1.2"),
]


@pytest.mark.parametrize("data,status,section", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_refused_and_nothing_after_it_served(served, data, status, section):
    """Issue 18 §2: each request above was accepted (or framed another way
    than a strict reader would frame it) before the fix, or is a guard for a
    smuggling vector llhttp refuses; RFC 9112 section in the parameters."""
    refused_on_wire(served, data, status)


def test_refusal_reasons_are_precise(served):
    """Issue 18 §2: each refusal names its cause (not llhttp's generic one)."""
    for data, status, words in [
        (b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\nContent-Length: 3\r\n\r\nabc",
         400, b"Transfer-Encoding"),
        (CHUNKED + b"0\r\n\n", 400, b"bare LF or CR"),
        (b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 400, b"request line"),
        (b"GET /\r\nHost: h\r\n\r\n", 400, b"version"),
        (b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
         501, b"transfer coding"),
        (b"GET / HTTP/1.1\r\nHost: a, b\r\n\r\n", 400, b"Host"),
        (b"GET * HTTP/1.1\r\nHost: h\r\n\r\n", 400, b"OPTIONS"),
    ]:
        out = refused_on_wire(served, data, status)
        assert words in out, out


VALID = [
    ("leading-crlf", b"\r\nGET /ok HTTP/1.1\r\nHost: h\r\n\r\n"),
    ("chunk-ext-and-trailer",
     CHUNKED.replace(b"POST /", b"POST /ok") + b"1;a=b\r\nx\r\n0\r\nX: 1\r\n\r\n"),
    ("te-case", CHUNKED.replace(b"POST /", b"POST /ok").replace(b"chunked", b"Chunked") +
     b"0\r\n\r\n"),
    ("chunk-sizes", CHUNKED.replace(b"POST /", b"POST /ok") + b"A\r\n0123456789\r\n"
     b"01\r\nx\r\n00\r\n\r\n"),
    ("options", b"OPTIONS /ok HTTP/1.1\r\nHost: h\r\n\r\n"),
    ("host-v6", b"GET /ok HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n"),
    ("host-empty", b"GET /ok HTTP/1.1\r\nHost:\r\n\r\n"),
    ("host-empty-port", b"GET /ok HTTP/1.1\r\nHost: a.b-c_d~e%41!$&'()*+;=:\r\n\r\n"),
    ("http10-no-host", b"GET /ok HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"),
]


@pytest.mark.parametrize("data", [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_strict_but_valid_requests_are_served(served, data):
    """Guards for the fixes above: what RFC 9112 allows stays served
    (§2.2 one leading empty line, §7.1.1 extensions, §7.1.2 trailers,
    §6.1 case-insensitive coding, RFC 3986 IP-literal Host, an empty Host)."""
    addr, paths = served
    statuses, out, _ = exchange(addr, data + b"GET /ok2 HTTP/1.1\r\nHost: h\r\n"
                                b"Connection: close\r\n\r\n")
    assert statuses == [200, 200], out
    assert paths == ["/ok", "/ok2"]


def test_absolute_form_authority_is_the_host(serve_wsgi):
    """Issue 18 §2: RFC 9112 §3.2.2: the absolute-form target's authority
    replaces Host (HTTP_HOST, SERVER_NAME, SERVER_PORT); PATH_INFO is its
    path, `/` when empty; `OPTIONS *` gives an empty PATH_INFO (the
    application root, PEP 3333) with REQUEST_URI `*`."""
    seen = []

    def app(environ, start_response):
        seen.append({k: environ[k] for k in ("HTTP_HOST", "SERVER_NAME", "SERVER_PORT",
                                             "PATH_INFO", "QUERY_STRING", "REQUEST_URI")})
        start_response("204 No Content", [])
        return []

    _, addr = serve_wsgi(app)
    statuses, out, _ = exchange(addr, b"GET http://example.com/x?q HTTP/1.1\r\nHost: other\r\n\r\n"
                                b"GET http://Example.org:8080 HTTP/1.1\r\nHost: other\r\n\r\n"
                                b"GET https://example.net?a HTTP/1.1\r\nHost: other\r\n\r\n"
                                b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n"
                                b"OPTIONS http://example.com HTTP/1.1\r\nHost: h\r\n"
                                b"Connection: close\r\n\r\n")
    assert statuses == [204] * 5, out
    assert seen[0]["HTTP_HOST"] == "example.com" and seen[0]["SERVER_NAME"] == "example.com"
    assert seen[0]["PATH_INFO"] == "/x" and seen[0]["QUERY_STRING"] == "q"
    assert seen[1]["HTTP_HOST"] == "Example.org:8080" and seen[1]["SERVER_NAME"] == "Example.org"
    assert seen[1]["SERVER_PORT"] == "8080" and seen[1]["PATH_INFO"] == "/"
    assert seen[2]["HTTP_HOST"] == "example.net" and seen[2]["SERVER_PORT"] == "443"
    assert seen[2]["PATH_INFO"] == "/" and seen[2]["QUERY_STRING"] == "a"
    assert seen[3]["PATH_INFO"] == "" and seen[3]["REQUEST_URI"] == "*"
    assert seen[4]["PATH_INFO"] == "" and seen[4]["HTTP_HOST"] == "example.com"


def _parse_split(data: bytes, cut: int):
    """The requests of data fed in two pieces at cut: [(PATH_INFO, body)],
    or the HttpError's (status, reason)."""
    from test_http_parser import HttpError, feed_pieces
    out: list = []
    try:
        feed_pieces(data, [cut], lambda env, body: (env["PATH_INFO"], body), out)
    except HttpError as exc:
        return exc.args[0]
    return out


@pytest.mark.parametrize("data,status", [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_refusals_hold_wherever_the_input_is_split(data, status):
    """Issue 18 §2: the scanner keeps its line state across reads: each
    case is refused with its status whatever byte a read ends on."""
    for cut in range(len(data) + 1):
        assert _parse_split(data + SMUGGLED, cut) == status, cut


@pytest.mark.parametrize("data", [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_requests_parse_alike_wherever_split(data):
    """Guard for issue 18 §2: the scanner never refuses a valid request
    because a read ended inside a line, a CRLF or a chunk size."""
    whole = _parse_split(data + SMUGGLED, len(data) + len(SMUGGLED))
    assert [path for path, _ in whole] == ["/ok", "/smuggled"]
    for cut in range(len(data) + len(SMUGGLED)):
        assert _parse_split(data + SMUGGLED, cut) == whole, cut


def test_trailer_field_with_empty_name_is_refused(served):
    """Found by the adversarial review of the parser after issue 18: an
    empty field name in the trailer section ("0\\r\\n: x\\r\\n\\r\\n") was
    accepted and the connection kept alive, while the same line in the head
    is a 400. RFC 9112 §5.1, §7.1.2: a field name is a token (one character
    at least); a strict reader refuses the message, so must we."""
    refused_on_wire(served, CHUNKED + b"0\r\n: x\r\n\r\n", 400)
    refused_on_wire(served, CHUNKED + b"1\r\nx\r\n0\r\nA: 1\r\n:\r\n\r\n", 400)


@pytest.mark.parametrize("target", [b"*x", b"*/admin", b"*?x", b"*#", b"h://x", b"ab://c"])
def test_targets_of_no_request_target_form_are_refused(served, target):
    """Found by the adversarial review of the parser after issue 18: llhttp
    takes bytes after a leading "*" ("GET */admin", "POST *?x"), and a
    scheme URI shorter than 7 bytes ("h://x") was not recognised as
    absolute-form, so neither the "* is for OPTIONS only" check nor the
    http(s) scheme check ran: each was served, PATH_INFO "*/admin", "*",
    "h://x", a path no router expects. RFC 9112 §3.2: the asterisk-form is
    "*" alone; any other target not starting with "/" is absolute-form."""
    refused_on_wire(served, b"GET " + target + b" HTTP/1.1\r\nHost: h\r\n\r\n", 400)
    refused_on_wire(served, b"OPTIONS " + target + b" HTTP/1.1\r\nHost: h\r\n\r\n", 400)


@pytest.mark.parametrize("data", [b"\rGET / HTTP/1.1\r\nHost: h\r\n\r\n",
                                  b"\r\n\rPOST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"])
def test_bare_cr_before_the_request_line_is_refused(served, data):
    """Found by the adversarial review of the parser after issue 18 (a
    differential run against h11): llhttp skips a CR before the method, and
    the scanner took it as a byte of the request line, so "\\rGET / ..."
    was served and the connection kept alive. RFC 9112 §2.2: a bare CR is
    invalid (or read as SP, which would make the line start with a space:
    400 either way)."""
    refused_on_wire(served, data, 400)
