"""The PROXY protocol ahead of a stream app (issue 24 §1: "for stream apps
too"): the worker loop on loopback with a proxy_protocol Policy, raw
client sockets. on_connect runs once the header is in, with conn.peer the
header's source and conn.proxy what it told; the bytes after the header
are the handler's first on_data; a bad or slow header, or a header from a
peer not allowed, closes the connection before the handler hears of it."""
from __future__ import annotations

import logging
import socket
import threading

import pytest

import proxy_reference as ref
from sockherd.worker.proxy import Policy
from test_http_parser_and_wsgi_framing import wait_for
from test_proxy_protocol_http import closed_lines, exchange

pytestmark = pytest.mark.timeout(60)

EVENTS: list = []
LOCK = threading.Lock()


class Greeter:
    """Writes the peer it sees at on_connect, then echoes."""

    def on_connect(self, conn):
        with LOCK:
            EVENTS.append(("connect", conn.peer, conn.proxy))
        conn.write(b"peer=%s\n" % repr(conn.peer).encode())

    def on_data(self, conn, data):
        conn.write(data)

    def on_close(self, conn):
        with LOCK:
            EVENTS.append(("close", conn.peer))


@pytest.fixture
def serve(serve_stream):
    EVENTS.clear()

    def start(mode="auto", allow=("127.0.0.0/8",), header_timeout=15.0):
        return serve_stream(Greeter, 2, proxy=Policy(mode, list(allow)),
                            header_timeout=header_timeout)
    return start


@pytest.mark.parametrize("header,peer", [
    (ref.v1("192.0.2.7", "127.0.0.1", 5555, 7), ("192.0.2.7", 5555)),
    (ref.v2("2001:db8::5", "::1", 6000, 7), ("2001:db8::5", 6000)),
])
def test_the_stream_app_sees_the_client_address(serve, header, peer):
    _, a = serve()
    out = exchange(a, header + b"ping")
    assert out == b"peer=%s\nping" % repr(peer).encode()
    connect = next(e for e in EVENTS if e[0] == "connect")
    assert connect[1] == peer and connect[2]["src"] == peer
    assert connect[2]["peer"][0] == "127.0.0.1"


def test_a_header_split_across_segments_then_data(serve):
    header = ref.v2("192.0.2.7", "127.0.0.1", 5555, 7, tlvs=ref.tlv(0x02, b"a.example"))
    _, a = serve("v2")
    pieces = [header[i:i + 3] for i in range(0, len(header), 3)]
    pieces[-1] += b"data"
    out = exchange(a, *pieces, pace=0.003)
    assert out.startswith(b"peer=('192.0.2.7', 5555)\n") and out.endswith(b"data")
    assert EVENTS[0][2]["authority"] == "a.example"


def test_local_keeps_the_real_peer(serve):
    _, a = serve("v2")
    with socket.create_connection(a, timeout=10) as c:
        me = c.getsockname()
        c.sendall(ref.v2(command=0) + b"x")
        c.shutdown(socket.SHUT_WR)
        out = b"".join(iter(lambda: c.recv(65536), b""))
    assert out == b"peer=%s\nx" % repr(me).encode()


@pytest.mark.parametrize("data", [b"ping", ref.v1()[:-2] + b"\n", ref.v2(crc=True)[:-1] + b"\1",
                                  ref.v2(fam=0x21), b"PROXY TCP4 " + b"9" * 120])
def test_a_bad_header_closes_before_the_handler_hears_of_it(serve, caplog, data):
    caplog.set_level(logging.INFO, logger="sockherd.worker")
    _, a = serve()
    assert exchange(a, data) == b""
    wait_for(lambda: closed_lines(caplog), 10, "the log line")
    assert EVENTS == []                                # no on_connect, no on_close


def test_a_slow_header_is_closed_at_header_timeout(serve, caplog):
    caplog.set_level(logging.INFO, logger="sockherd.worker")
    _, a = serve("v1", header_timeout=0.5)
    with socket.create_connection(a, timeout=10) as c:
        c.sendall(b"PROXY TCP4 ")
        assert c.recv(100) == b""
    wait_for(lambda: closed_lines(caplog), 10, "the log line")
    assert "header_timeout" in closed_lines(caplog)[0] and EVENTS == []


def test_a_peer_not_allowed(serve, caplog):
    """Its header is refused; its plain bytes are the handler's, with its
    own address."""
    caplog.set_level(logging.INFO, logger="sockherd.worker")
    _, a = serve(allow=("10.0.0.0/8",))
    assert exchange(a, ref.v1() + b"ping") == b""
    wait_for(lambda: closed_lines(caplog), 10, "the log line")
    assert "not in proxy_allow_from" in closed_lines(caplog)[0]
    out = exchange(a, b"PR", b"OBE", pace=0.05)
    assert out.startswith(b"peer=('127.0.0.1', ") and out.endswith(b"PROBE")
