"""Framing cases where the engine and the strict reference (http_reference.py)
disagree, each pinned on the Parser and on a real socket: the defects the
parser branch is fixing (issue 18 §2), and the fuzz target's new findings
(test_http_framing_fuzz.py steps around both so that it keeps looking).
Each is xfail(strict=True): it starts passing once its fix lands, and the
mark must then go."""
from __future__ import annotations

import socket

import pytest

from http_reference import frame
from test_engine_review import closed_within
from test_http_framing_fuzz import Echo, check_parser, check_server, parser_frames

pytestmark = pytest.mark.timeout(60)

H = b"Host: h\r\n"
CHUNKED = b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
NEXT = b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n"


def xfail(reason):
    return pytest.mark.xfail(strict=True, reason=reason)


EMPTY_EXT = xfail("fuzz finding: a chunk extension with an empty name or value (';;a', ';=x', "
                  "';a=', also on the last chunk) is accepted (RFC 9112 §7.1.1: token "
                  "names, token or quoted-string values)")

# (input, why the reference refuses, mark): the engine accepts each of them
REFUSED = {
    "empty te with cl": (b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\nContent-Length: 3"
                         b"\r\n\r\nabc" + NEXT,
                         xfail("issue 18 §2: empty Transfer-Encoding with Content-Length accepted")),
    "empty te alone": (b"GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\n\r\n" + NEXT,
                       xfail("issue 18 §2 (same root): an empty Transfer-Encoding is taken as "
                             "absent, also without Content-Length")),
    "empty te on http/1.0": (b"GET / HTTP/1.0\r\nTransfer-Encoding:\r\nConnection: keep-alive"
                             b"\r\n\r\n" + NEXT,
                             xfail("issue 18 §2 (same root): an empty Transfer-Encoding is "
                                   "accepted on HTTP/1.0")),
    "bare lf after last chunk": (CHUNKED + b"1\r\na\r\n0\r\n\n" + NEXT,
                                 xfail("issue 18 §2: bare LF after the last chunk accepted")),
    "bare lf ending trailers": (CHUNKED + b"1\r\na\r\n0\r\nT: 1\r\n\n" + NEXT,
                                xfail("issue 18 §2: bare LF ending the trailers accepted")),
    "bare lf ending request line": (b"GET / HTTP/1.1\n" + H + b"\r\n",
                                    xfail("issue 18 §2: bare LF ending the request line accepted")),
    "bare lf ending head": (b"GET / HTTP/1.1\r\n" + H + b"\n",
                            xfail("issue 18 §2: bare LF ending the head accepted")),
    "doubled space": (b"GET  / HTTP/1.1\r\n" + H + b"\r\n",
                      xfail("issue 18 §2: doubled spaces in the request line accepted")),
    "http/0.9 line": (b"GET /\r\n" + H + b"\r\n",
                      xfail("issue 18 §2: request line without a version accepted")),
    "gzip, chunked": (b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
                      b"0\r\n\r\n", xfail("issue 18 §2: Transfer-Encoding: gzip, chunked (501)")),
    "host list": (b"GET / HTTP/1.1\r\nHost: a, b\r\n\r\n", xfail("issue 18 §2: Host: a, b accepted")),
    "asterisk with get": (b"GET * HTTP/1.1\r\n" + H + b"\r\n",
                          xfail("issue 18 §2: * target with a non-OPTIONS method accepted")),
    "absolute-form": (b"GET http://h/p HTTP/1.1\r\n" + H + b"\r\n",
                      xfail("issue 18 §2: absolute-form target")),
    # ---- new findings of the fuzz target -----------------------------------------------
    "bare cr before a request": (b"\rGET / HTTP/1.1\r\n" + H + b"\r\n",
                                 xfail("fuzz finding: a lone CR before a request line is "
                                       "skipped as if it were an empty line (RFC 9112 §2.2 "
                                       "allows CRLF only)")),
    "bare cr between requests": (b"GET / HTTP/1.1\r\n" + H + b"\r\n\rGET /2 HTTP/1.1\r\n" + H + b"\r\n",
                                 xfail("fuzz finding: a lone CR between pipelined requests is "
                                       "skipped and the second request served")),
    "bare lf before a request": (b"\nGET / HTTP/1.1\r\n" + H + b"\r\n",
                                 xfail("fuzz finding: a lone LF before a request line is "
                                       "skipped (CRLF-only policy)")),
    "quote in target": (b'GET /a"b HTTP/1.1\r\n' + H + b"\r\n",
                        xfail('fuzz finding: bytes outside RFC 3986 (" { } | \\ ^ `) '
                              "accepted in the request-target")),
    "star-prefixed target": (b"OPTIONS *0 HTTP/1.1\r\n" + H + b"\r\n",
                             xfail("fuzz finding: a target starting with '*' that is not '*' "
                                   "('*0', '*/x', '**') is accepted, with OPTIONS or any method")),
    "fragment in target": (b"GET /a#f HTTP/1.1\r\n" + H + b"\r\n",
                           xfail("fuzz finding: '#' (a fragment) is accepted in the "
                                 "request-target (RFC 9112 §3.2 has none)")),
    "obs-fold in trailers": (CHUNKED + b"1\r\nx\r\n0\r\nT: 1\r\n x\r\n\r\n" + NEXT,
                             xfail("fuzz finding: obsolete line folding in the trailers "
                                   "(a trailer line, then ' x' or '\\tx') is accepted, and "
                                   "the next request served; the head refuses it")),
    "empty trailer field name": (CHUNKED + b"1\r\nx\r\n0\r\n: v\r\n\r\n" + NEXT,
                                 xfail("fuzz finding: a trailer line with an empty field name "
                                       "(': v') is accepted; the head refuses it")),
    "brace in target": (b"GET /a{b}|c HTTP/1.1\r\n" + H + b"\r\n",
                        xfail("fuzz finding: bytes outside RFC 3986 accepted in the "
                              "request-target")),
    **{f"empty chunk extension {n}": (CHUNKED + body, EMPTY_EXT) for n, body in (
        ("name", b"1;;a\r\nx\r\n0\r\n\r\n"), ("name with a value", b"1;=x\r\nx\r\n0\r\n\r\n"),
        ("value", b"1;a=\r\nx\r\n0\r\n\r\n"), ("value on the last chunk", b"1\r\nx\r\n0;a=\r\n\r\n"))},
}

# (input): RFC 9112 §7.1.1 chunk extensions the reference accepts and the engine refuses
ACCEPTED = {
    "bws before ;": CHUNKED + b"1 ;a\r\nx\r\n0\r\n\r\n",
    "bws after ;": CHUNKED + b"1; a\r\nx\r\n0\r\n\r\n",
    "bws around =": CHUNKED + b"1;a = b\r\nx\r\n0\r\n\r\n",
    "quoted-pair": CHUNKED + b'1;a="x\\"y"\r\nx\r\n0\r\n\r\n',
    "name after a valued ext": CHUNKED + b"1;a=b;c\r\nx\r\n0\r\n\r\n",
}
ACCEPTED_MARK = xfail("fuzz finding: chunk extensions RFC 9112 §7.1.1 allows (BWS around ';' "
                      "and '=', quoted-pair, an extension after one with a value) are refused "
                      "with 400 'Invalid character in chunk size'")


CASES = {**REFUSED, **{name: (data, ACCEPTED_MARK) for name, data in ACCEPTED.items()}}


def test_the_reference_refuses_or_accepts_each_case():
    """The oracle is right about each pinned case."""
    for name, (data, _) in REFUSED.items():
        assert frame(data).end == "reject", name
    for name, data in ACCEPTED.items():
        ref = frame(data)
        assert ref.end == "done" and [r.body for r in ref.requests] == [b"x"], name


@pytest.mark.parametrize("name", [pytest.param(n, marks=m) for n, (_, m) in CASES.items()])
def test_parser_frames_as_the_reference(name):
    """Reproduces CASES[name] on the Parser: REFUSED ones are framed as
    requests, ACCEPTED ones refused."""
    check_parser(CASES[name][0], [], mutated=False)


@pytest.mark.parametrize("name", [pytest.param(n, marks=m) for n, (_, m) in CASES.items()])
def test_server_frames_as_the_reference(serve_wsgi, name):
    """Reproduces CASES[name] on a real socket: the app is given a request
    the reference refuses, or none where it accepts one."""
    app = Echo()
    _, addr = serve_wsgi(app)
    check_server(app, addr, CASES[name][0], [], mutated=False)


# ---- findings of the gunicorn corpus replay (bench/gunicorn_corpus.py) -------------------------

@pytest.mark.xfail(strict=True, reason="corpus finding: an unregistered method (a valid token, "
                   "gunicorn valid/031) is answered 400, where RFC 9110 §9.1 says 501")
def test_unknown_method_is_answered_501(serve_wsgi):
    """Reproduces: `-BLARGH /foo HTTP/1.1` gets 400 'Invalid method encountered'."""
    _, addr = serve_wsgi(Echo())
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"-BLARGH /foo HTTP/1.1\r\nHost: h\r\n\r\n")
        _, out = closed_within(c, 10)
    assert out.startswith(b"HTTP/1.1 501 "), out[:60]


@pytest.mark.xfail(strict=True, reason="corpus finding: two Content-Type field lines are "
                   "joined into CONTENT_TYPE 'a/b,c/d' (gunicorn invalid/041 refuses them)")
def test_repeated_content_type_is_refused():
    """Reproduces: Content-Type: a/b + Content-Type: c/d gives the app CONTENT_TYPE 'a/b,c/d'."""
    got, how = parser_frames(b"GET / HTTP/1.1\r\nHost: h\r\nContent-Type: a/b\r\n"
                             b"Content-Type: c/d\r\n\r\n", [])
    assert got == [] and how == "refused"
