"""Issue 35 review of point 21 (a PROXY v2 AF_UNIX source on a TCP
connection): the engine's HTTP path now keeps the socket's addresses and
leaves the raw path in proxy["src"] (conn_proxy.c apply), but the stream
handlers' path (worker/stream_proxy.py _proxy_feed) still makes the path
the connection's peer: conn.peer is a str of whatever bytes the proxy
copied (a unix client picks its own socket's path), not the (host, port)
a TCP connection's peer is, and it reaches the error log raw: a handler's
error is logged "connection from <peer>: ..." (stream_core.py), so CR/LF
in the path writes a forged line, the defect point 21 fixed for the
access log.

The worker loop on loopback with a proxy_protocol Policy (as
test_proxy_protocol_stream.py), the test as the proxy."""
from __future__ import annotations

import logging
import socket

import pytest

import proxy_reference as ref
from sockherd.worker.proxy import Policy

pytestmark = pytest.mark.timeout(60)

FORGED = b"/run/c.sock\r\n2026-12-03 00:00:00,000 [worker 1] INFO forged line\r\n"
BLOCK = FORGED.ljust(108, b"\0") + b"/run/server.sock".ljust(108, b"\0")
HEADER = ref.v2(addresses=BLOCK, fam=0x31)
SEEN: list = []


class Failing:
    def on_connect(self, conn):
        SEEN.append(conn.peer)
        raise RuntimeError("the handler's own error")

    def on_data(self, conn, data):
        pass

    def on_close(self, conn):
        pass


def test_a_unix_source_leaves_the_stream_peer_the_sockets(serve_stream, caplog):
    SEEN.clear()
    _, a = serve_stream(Failing, 1, proxy=Policy("v2", ["127.0.0.0/8"]))
    with caplog.at_level(logging.WARNING):
        with socket.create_connection(a, timeout=10) as c:
            mine = c.getsockname()
            c.sendall(HEADER + b"x")
            c.shutdown(socket.SHUT_WR)
            while c.recv(65536):
                pass
    assert SEEN, caplog.text
    assert SEEN[0] == mine, SEEN                 # before: the path, as a str
    assert "\r\n2026-12-03" not in caplog.text and "\n2026-12-03" not in caplog.text, caplog.text
