"""The PROXY protocol ahead of HTTP (issue 24 §1): a real engine on loopback
with proxy_protocol set, raw client sockets writing v1 and v2 headers. The
header's source becomes REMOTE_ADDR / REMOTE_PORT (and the ASGI client),
its TLVs the proxy.* environ keys and the "proxy" scope extension; LOCAL
and UNKNOWN keep the socket's peer; a missing, malformed, oversized,
truncated or slow header from an allowed peer closes the connection with
no answer and a log line; so does a header from a peer not allowed, whose
plain requests are served as before."""
from __future__ import annotations

import json
import logging
import select
import socket
import time

import pytest

import proxy_reference as ref
from test_http_parser_and_wsgi_framing import wait_for

pytestmark = pytest.mark.timeout(60)

GET = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n"


def environ_app(environ, start_response):
    """Answers the addresses and the proxy.* keys it was given, as JSON."""
    seen = {k: v for k, v in environ.items()
            if k in ("REMOTE_ADDR", "REMOTE_PORT") or k.startswith("proxy.")}
    body = json.dumps(seen, default=repr).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body)))])
    return [body]


@pytest.fixture
def serve(serve_wsgi):
    def start(mode="auto", allow=("127.0.0.0/8",), **cfg):
        return serve_wsgi(environ_app, proxy_protocol=mode, proxy_allow_from=list(allow), **cfg)
    return start


def exchange(addr, *pieces: bytes, pace: float = 0.0) -> bytes:
    """Sends the pieces (pace: seconds between them, each checked to get no
    answer meanwhile: the connection waits, silent and open), then reads
    to the end (the app's answer; Connection: close is not asked, so the
    client half-closes)."""
    with socket.create_connection(addr, timeout=10) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i, piece in enumerate(pieces):
            c.sendall(piece)
            if pace and i < len(pieces) - 1:
                ready, _, _ = select.select([c], [], [], pace)
                assert not ready, "answered or closed before the header was whole"
        c.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := c.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass                          # closed over unread input: a reset is a close
        return out


def body_of(answer: bytes) -> dict:
    assert answer.startswith(b"HTTP/1.1 200 "), answer
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


def closed_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.getMessage().startswith("closed the connection from ")]


# ---- headers that name the client ---------------------------------------------------------

@pytest.mark.parametrize("mode,header,addr,port", [
    ("v1", ref.v1("192.0.2.7", "127.0.0.1", 5555, 80), "192.0.2.7", "5555"),
    ("v1", ref.v1("2001:db8::7", "::1", 1, 443), "2001:db8::7", "1"),
    ("v2", ref.v2("198.51.100.9", "127.0.0.1", 40000, 80), "198.51.100.9", "40000"),
    ("v2", ref.v2("2001:db8::9", "2001:db8::1", 65535, 80), "2001:db8::9", "65535"),
    ("auto", ref.v1("192.0.2.8", "127.0.0.1", 6, 80), "192.0.2.8", "6"),
    ("auto", ref.v2("192.0.2.9", "127.0.0.1", 7, 80), "192.0.2.9", "7"),
])
def test_the_header_source_becomes_remote_addr(serve, mode, header, addr, port):
    _, a = serve(mode)
    seen = body_of(exchange(a, header + GET))
    assert (seen["REMOTE_ADDR"], seen["REMOTE_PORT"]) == (addr, port)
    assert seen["proxy.version"] == (1 if header.startswith(b"PROXY") else 2)
    assert seen["proxy.peer"][0] == "127.0.0.1"          # the proxy's own address


def test_a_unix_source_path(serve):
    """An AF_UNIX source is no address: the socket's peer is kept, the path
    is told in proxy.src (issue 35 point 21; it used to be REMOTE_ADDR)."""
    block = b"/run/client.sock".ljust(108, b"\0") + b"/run/server.sock".ljust(108, b"\0")
    _, a = serve("v2")
    seen = body_of(exchange(a, ref.v2(addresses=block, fam=0x31) + GET))
    assert seen["REMOTE_ADDR"] == "127.0.0.1" and seen["REMOTE_PORT"].isdigit()
    assert (seen["proxy.src"], seen["proxy.dst"]) == ("/run/client.sock", "/run/server.sock")


@pytest.mark.parametrize("header", [
    ref.v2(command=0),                                  # LOCAL: the proxy's health check
    ref.v2(command=0, fam=0x00, addresses=b""),
    ref.v2(fam=0x00, addresses=b""),                   # PROXY over UNSPEC
    b"PROXY UNKNOWN\r\n",
    b"PROXY UNKNOWN 1.2.3.4 5.6.7.8 1 2\r\n",
])
def test_local_and_unknown_keep_the_real_peer(serve, header):
    _, a = serve("auto")
    with socket.create_connection(a, timeout=10) as c:
        real = c.getsockname()
        c.sendall(header + GET)
        c.shutdown(socket.SHUT_WR)
        answer = b"".join(iter(lambda: c.recv(65536), b""))
    seen = body_of(answer)
    assert (seen["REMOTE_ADDR"], seen["REMOTE_PORT"]) == (real[0], str(real[1]))
    assert seen["proxy.local"] is True


def test_tlvs_are_exposed_in_the_environ(serve):
    tlvs = (ref.tlv(0x01, b"h2") + ref.tlv(0x02, b"example.com") + ref.tlv(0x04, b"\0\0") +
            ref.tlv(0x05, b"id-1") +
            ref.ssl_tlv(client=7, verify=0, version="TLSv1.3", cn="client.example",
                        cipher="TLS_AES_128_GCM_SHA256", sig_alg="RSA-SHA256", key_alg="RSA2048"))
    _, a = serve("v2")
    seen = body_of(exchange(a, ref.v2(tlvs=tlvs, crc=True) + GET))
    assert seen["proxy.alpn"] == "h2" and seen["proxy.authority"] == "example.com"
    assert seen["proxy.unique_id"] == repr(b"id-1")
    assert seen["proxy.ssl"] == {"client": 7, "verify": 0, "version": "TLSv1.3",
                                 "cn": "client.example", "cipher": "TLS_AES_128_GCM_SHA256",
                                 "sig_alg": "RSA-SHA256", "key_alg": "RSA2048"}
    assert seen["proxy.dst"] == ["127.0.0.1", 80]


def test_requests_after_the_header_keep_its_address(serve):
    """The header comes once per connection: every request on it (kept
    alive, pipelined) has its source."""
    _, a = serve("v1")
    answer = exchange(a, ref.v1("192.0.2.7", "127.0.0.1", 5555, 80) + GET + GET + GET)
    parts = answer.split(b"HTTP/1.1 200 ")[1:]
    assert len(parts) == 3
    for part in parts:
        assert json.loads(part.split(b"\r\n\r\n", 1)[1])["REMOTE_ADDR"] == "192.0.2.7"


@pytest.mark.parametrize("header", [ref.v1("192.0.2.7", "127.0.0.1", 5555, 80),
                                    ref.v2("192.0.2.7", "127.0.0.1", 5555, 80,
                                           tlvs=ref.tlv(0x02, b"a.example"), crc=True)])
def test_a_header_split_across_segments(serve, header):
    """Byte by byte, then the request in two: the connection waits for the
    whole header (no answer, no close), then serves."""
    _, a = serve("auto")
    pieces = [header[i:i + 1] for i in range(len(header))] + [GET[:5], GET[5:]]
    seen = body_of(exchange(a, *pieces, pace=0.003))
    assert seen["REMOTE_ADDR"] == "192.0.2.7"


def test_the_header_alone_then_the_request(serve):
    """A header whole with nothing after it: the request that follows in
    its own segment is served (nothing was answered in between)."""
    _, a = serve("v2")
    seen = body_of(exchange(a, ref.v2("192.0.2.7"), GET, pace=0.05))
    assert seen["REMOTE_ADDR"] == "192.0.2.7"


# ---- refused ---------------------------------------------------------------------------------

BAD = {
    "no header": GET,
    "bad v2 signature": b"\r\n\r\n\x00\r\nQUIX\n" + ref.v2()[12:] + GET,
    "v1 without CRLF in 107 bytes": b"PROXY TCP4 " + b"1" * 120 + b"\r\n" + GET,
    "v1 bare LF": b"PROXY TCP4 192.0.2.7 127.0.0.1 1 2\n" + GET,
    "v1 bad address": ref.v1("256.1.1.1", "127.0.0.1", 1, 2, proto="TCP4") + GET,
    "v1 v6 address under TCP4": ref.v1("::1", "::1", 1, 2, proto="TCP4") + GET,
    "v1 port out of range": b"PROXY TCP4 192.0.2.7 127.0.0.1 65536 80\r\n" + GET,
    "v1 leading zero": b"PROXY TCP4 192.0.2.7 127.0.0.1 080 80\r\n" + GET,
    "v1 two spaces": b"PROXY TCP4  192.0.2.7 127.0.0.1 1 80\r\n" + GET,
    "v1 unknown protocol": b"PROXY UDP4 192.0.2.7 127.0.0.1 1 80\r\n" + GET,
    "v2 oversized": ref.v2(tlvs=ref.tlv(0x04, b"\0" * 2100)) + GET,
    "v2 version 1": ref.v2()[:12] + b"\x11" + ref.v2()[13:] + GET,
    "v2 bad command": ref.v2(command=2) + GET,
    "v2 datagram": ref.v2(fam=0x12) + GET,
    "v2 family 4": ref.v2(fam=0x41) + GET,
    "v2 TCP6 with a TCP4 length": ref.v2(fam=0x21) + GET,
    "v2 TLV past the end": ref.v2(tlvs=b"\x01\x00\x09ab") + GET,
    "v2 bad CRC": ref.v2(crc=True)[:-1] + b"\x00" + GET,
    "v2 CRC of 3 bytes": ref.v2(tlvs=ref.tlv(0x03, b"\0\0\0")) + GET,
    "v2 short SSL TLV": ref.v2(tlvs=ref.tlv(0x20, b"\x01\0\0")) + GET,
    "v2 unique id over 128": ref.v2(tlvs=ref.tlv(0x05, b"u" * 129)) + GET,
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_header_from_an_allowed_peer_closes_with_a_log_line(serve, caplog, case):
    caplog.set_level(logging.INFO, logger="sockherd.worker")
    loop, a = serve("auto")
    assert exchange(a, BAD[case]) == b""                  # no answer: the app never ran
    wait_for(lambda: closed_lines(caplog), 10, "the log line")
    assert "PROXY" in closed_lines(caplog)[0] and "127.0.0.1:" in closed_lines(caplog)[0]
    assert loop.engine.proxy_refused == 1


@pytest.mark.parametrize("mode,header", [("v1", ref.v2()), ("v2", ref.v1())])
def test_the_other_version_is_refused_in_a_fixed_mode(serve, mode, header):
    _, a = serve(mode)
    assert exchange(a, header + GET) == b""


def test_a_truncated_header_closes_with_a_log_line(serve, caplog):
    caplog.set_level(logging.INFO, logger="sockherd.worker")
    _, a = serve("v2")
    assert exchange(a, ref.v2()[:20]) == b""
    wait_for(lambda: closed_lines(caplog), 10, "the log line")
    assert "truncated" in closed_lines(caplog)[0]


def test_a_slow_header_counts_against_header_timeout(serve, caplog):
    """Half a header, then nothing: closed at header_timeout, no 408."""
    caplog.set_level(logging.INFO, logger="sockherd.worker")
    _, a = serve("v1", header_timeout=0.5)
    with socket.create_connection(a, timeout=10) as c:
        c.sendall(b"PROXY TCP4 192.0.2.7")
        start = time.monotonic()
        assert c.recv(100) == b""
        assert time.monotonic() - start < 5
    wait_for(lambda: closed_lines(caplog), 10, "the log line")
    assert "header_timeout" in closed_lines(caplog)[0]


def test_refusals_are_logged_at_most_once_a_second(serve, caplog):
    caplog.set_level(logging.INFO, logger="sockherd.worker")
    loop, a = serve("v2")
    for _ in range(5):
        assert exchange(a, GET) == b""
    wait_for(lambda: loop.engine.proxy_refused == 5, 10, "5 refusals")
    assert len(closed_lines(caplog)) == 1


# ---- peers not allowed ---------------------------------------------------------------------------

def test_a_header_from_a_peer_not_allowed_is_refused(serve, caplog):
    caplog.set_level(logging.INFO, logger="sockherd.worker")
    loop, a = serve("auto", allow=("10.0.0.0/8",))
    for header in (ref.v1("192.0.2.7"), ref.v2("192.0.2.7")):
        assert exchange(a, header + GET) == b""
    wait_for(lambda: closed_lines(caplog), 10, "the log line")
    assert "not in proxy_allow_from" in closed_lines(caplog)[0]
    assert loop.engine.proxy_refused == 2


def test_a_peer_not_allowed_is_served_as_itself(serve):
    """Its plain requests are HTTP as ever, its own address the client's
    (even a request starting with a byte of a signature: "P")."""
    _, a = serve("auto", allow=("10.0.0.0/8",))
    seen = body_of(exchange(a, GET))
    assert seen["REMOTE_ADDR"] == "127.0.0.1" and "proxy.version" not in seen
    seen = body_of(exchange(a, b"P", b"OST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n",
                            pace=0.05))
    assert seen["REMOTE_ADDR"] == "127.0.0.1"


def test_off_serves_a_header_as_bytes_of_http(serve_wsgi):
    """proxy_protocol off (the default): nothing is parsed; a header is a
    request line of an unknown method (HTTP's own refusal)."""
    _, a = serve_wsgi(environ_app)
    assert exchange(a, ref.v1() + GET).startswith(b"HTTP/1.1 501 ")


# ---- ASGI ---------------------------------------------------------------------------------------

async def scope_app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = json.dumps({"client": scope["client"],
                       "proxy": scope.get("extensions", {}).get("proxy")}, default=repr).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def test_asgi_client_and_the_proxy_extension(serve_asgi):
    _, a = serve_asgi(scope_app, proxy_protocol="v2", proxy_allow_from=["127.0.0.1"])
    seen = body_of(exchange(a, ref.v2("203.0.113.5", "127.0.0.1", 4242, 80,
                                      tlvs=ref.tlv(0x01, b"http/1.1")) + GET))
    assert seen["client"] == ["203.0.113.5", 4242]
    assert seen["proxy"]["alpn"] == "http/1.1" and seen["proxy"]["src"] == ["203.0.113.5", 4242]
