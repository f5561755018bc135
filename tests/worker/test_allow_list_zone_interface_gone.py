"""Issue 35 review of point 24 (an allow-list entry's IPv6 zone): the
engine's networks carry the zone's interface index resolved once, when
the settings are applied (netmatch.Allow.packed), but the Python side,
Allow.allows (proxy_allow_from for stream handlers, worker/proxy.py),
resolves the interface's name again on every connection
(socket.if_nametoindex). When that interface goes away after the start (a
VPN or container link taken down, renamed, re-created with another
index), the lookup raises OSError inside the stream connection's
construction: it escapes the accept path, the loop thread dies
(loop.errors), and the link-local peer's connections hang unanswered
until the worker is replaced; a re-created interface would also be judged
by its new index here and by the old one in the engine.

A real worker Loop over a real fdcore Table listening on this host's own
link-local address (as test_allow_list_zone.py), the test as the proxy;
the interface's disappearance is if_nametoindex failing from then on."""
from __future__ import annotations

import socket

import pytest

import proxy_reference as ref
from sockherd.fdcore import Table
from sockherd.worker import netmatch
from sockherd.worker.loop import Loop
from sockherd.worker.proxy import Policy
from test_allow_list_zone import LL, needs_ll

pytestmark = [pytest.mark.timeout(60), needs_ll]


class Echo:
    def on_connect(self, conn):
        conn.write(b"peer=%r\n" % (conn.peer,))

    def on_data(self, conn, data):
        conn.write(data)

    def on_close(self, conn):
        pass


def one(addr) -> bytes:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as c:
        c.settimeout(5)
        c.connect(addr)
        c.sendall(ref.v1("192.0.2.7", "127.0.0.1", 5555, 7) + b"ping")
        c.shutdown(socket.SHUT_WR)
        try:
            return b"".join(iter(lambda: c.recv(65536), b""))
        except socket.timeout:
            return b"<no answer>"


def test_a_zoned_entry_whose_interface_went_away_kills_no_loop_thread(monkeypatch):
    table = Table(1, 1)
    loop = Loop(table, Echo, proxy=Policy("v1", [f"{LL[0]}%{LL[2]}"]))
    srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    srv.bind((LL[0], 0, 0, LL[1]))
    srv.listen(64)
    addr = srv.getsockname()
    loop.add_listener(srv)
    loop.start()
    try:
        assert one(addr) == b"peer=('192.0.2.7', 5555)\nping"

        def gone(name):
            raise OSError(19, "No such device")
        monkeypatch.setattr(netmatch.socket, "if_nametoindex", gone)
        # judged as at the start (the index the engine has too): still trusted
        assert one(addr) == b"peer=('192.0.2.7', 5555)\nping"
        assert not loop.errors, loop.errors
    finally:
        monkeypatch.undo()
        loop.stop()
        table.close()
