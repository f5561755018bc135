"""An allow-list entry with an IPv6 zone (issue 35 point 24):
`fe80::1%eth0` lost its zone when parsed, so fe80::1 was trusted on every
interface, though on another link that address is another host. Now a
zoned entry allows its address on that interface only (the peer's
sin6_scope_id), for forwarded_allow_ips and proxy_allow_from alike; an
entry without a zone still allows it on any; a zone on an address that
is not link-local (the kernel tells no interface for those) or naming no
interface of this host is refused with the entry named.

A real worker Loop over a real fdcore Table listening on this host's own
link-local address (bound with its interface's index; the kernel keeps
the scope id on a connection to itself), the test as the proxy. Skipped
where no interface other than lo has one."""
from __future__ import annotations

import ipaddress
import socket

import pytest

import proxy_reference as ref
from sockherd.fdcore import Table
from sockherd.worker import netmatch
from sockherd.worker.loop import Loop
from sockherd.worker.wsgi import make_handler
from test_forwarded_headers import echo, read_response, request

pytestmark = pytest.mark.timeout(60)


def link_local() -> tuple[str, int, str] | None:
    """(address, interface index, interface name) of a link-local address
    of an interface other than lo, or None."""
    try:
        with open("/proc/net/if_inet6") as f:
            rows = [line.split() for line in f]
    except OSError:
        return None
    for hexaddr, index, _, scope, _, name in rows:
        if scope == "20" and name != "lo":                  # IPV6_ADDR_LINKLOCAL
            return str(ipaddress.IPv6Address(bytes.fromhex(hexaddr))), int(index, 16), name
    return None


LL = link_local()
needs_ll = pytest.mark.skipif(LL is None, reason="no link-local address off lo")


@pytest.fixture
def serve_ll():
    """start(app, **settings) -> the listener's 4-tuple address, on LL."""
    made = []

    def start(app, **cfg):
        table = Table(1, 1)
        loop = Loop(table, make_handler(app, {"threads": 1, **cfg}))
        made.append((loop, table))
        srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        srv.bind((LL[0], 0, 0, LL[1]))
        srv.listen(64)
        addr = srv.getsockname()
        loop.add_listener(srv)
        loop.start()
        return addr

    yield start
    for loop, table in made:
        loop.stop()
        table.close()
        assert not loop.errors, loop.errors


def exchange(addr, data: bytes) -> tuple[int | None, dict | bytes]:
    """(status, JSON body) of one request, or (None, b"") if closed unanswered."""
    import json
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as c:
        c.settimeout(10)
        c.connect(addr)
        assert c.getsockname()[3] == LL[1]               # the peer's scope id the server sees
        c.sendall(data)
        try:
            status, body = read_response(c)
        except (AssertionError, ConnectionResetError):
            return None, b""
    return status, json.loads(body)


SPOOF = request("/", [("X-Forwarded-For", "192.0.2.66")])


@needs_ll
def test_forwarded_allow_ips_zone_is_kept(serve_ll):
    addr = serve_ll(echo, forwarded_allow_ips=[f"{LL[0]}%{LL[2]}"])
    assert exchange(addr, SPOOF)[1]["REMOTE_ADDR"] == "192.0.2.66"
    addr = serve_ll(echo, forwarded_allow_ips=[f"{LL[0]}%{LL[1]}"])     # the index, too
    assert exchange(addr, SPOOF)[1]["REMOTE_ADDR"] == "192.0.2.66"


@needs_ll
def test_forwarded_allow_ips_other_zone_trusts_nothing(serve_ll):
    addr = serve_ll(echo, forwarded_allow_ips=[f"{LL[0]}%lo"])
    assert exchange(addr, SPOOF)[1]["REMOTE_ADDR"] == LL[0]
    addr = serve_ll(echo, forwarded_allow_ips=["fe80::%lo/10"])
    assert exchange(addr, SPOOF)[1]["REMOTE_ADDR"] == LL[0]


@needs_ll
def test_no_zone_trusts_every_interface(serve_ll):
    addr = serve_ll(echo, forwarded_allow_ips=[LL[0]])
    assert exchange(addr, SPOOF)[1]["REMOTE_ADDR"] == "192.0.2.66"


@needs_ll
def test_proxy_allow_from_zone(serve_ll):
    header = ref.v1("192.0.2.7", "127.0.0.1", 5555, 80)
    plain = request("/")
    addr = serve_ll(echo, proxy_protocol="v1", proxy_allow_from=[f"{LL[0]}%{LL[2]}"])
    assert exchange(addr, header + plain)[1]["REMOTE_ADDR"] == "192.0.2.7"
    addr = serve_ll(echo, proxy_protocol="v1", proxy_allow_from=[f"{LL[0]}%lo"])
    assert exchange(addr, header + plain) == (None, b"")    # a header from a peer not allowed
    assert exchange(addr, plain)[1]["REMOTE_ADDR"] == LL[0]  # served as its own


@pytest.mark.parametrize("entry,said", [
    ("fd00::1%eth0", "names the interface of a link-local address"),
    ("::1%lo", "names the interface of a link-local address"),
    ("fe80::1%no-such-if", "no network interface 'no-such-if' on this host"),
])
def test_a_zone_that_cannot_match_is_refused(entry, said):
    with pytest.raises(ValueError, match=said) as e:
        netmatch.parse("forwarded_allow_ips", [entry])
    assert repr(entry) in str(e.value)


def test_the_stream_interface_reads_the_zone_alike():
    """worker/proxy.py's Policy (a stream app's PROXY header) asks
    Allow.allows with socket.getpeername()'s 4-tuple."""
    zoned = netmatch.parse("proxy_allow_from", ["fe80::1%1"])
    assert zoned.packed() == [(ipaddress.IPv6Address("fe80::1").packed, 128, 1)]
    assert zoned.allows(("fe80::1", 5, 0, 1))
    assert not zoned.allows(("fe80::1", 5, 0, 2)) and not zoned.allows(("fe80::1", 5, 0, 0))
    assert netmatch.parse("proxy_allow_from", ["fe80::1"]).allows(("fe80::1", 5, 0, 2))
