"""The PROXY protocol in the worker: who may send a header (proxy_allow_from)
and the stream interface's use of the native parser.

The header itself is parsed in native code (worker/native/proxy_proto.c):
for HTTP inside the engine's connection layer (conn_proxy.c), for the
stream interface by stream.Connection (the module's proxy_parse), the same
parser either way. This module imports no native code: the master checks
the setting with it.

proxy_allow_from entries: an address or CIDR (`10.0.0.0/8`, `::1`), `unix`
(peers of unix-socket listeners), or `*` (every peer). The default is
loopback and unix sockets: a proxy on the same host (deploy/'s HAProxy, a
sidecar) works with no setting, and no remote peer can name a client
unless the operator lists it (a header from a peer not listed is refused,
since it could name any client it likes).
"""
from __future__ import annotations

import ipaddress
import logging
import time

log = logging.getLogger("sockherd.worker")

DEFAULT_ALLOW = ["127.0.0.0/8", "::1", "unix"]


class Policy:
    """proxy_protocol and proxy_allow_from, parsed once per worker."""

    def __init__(self, mode: str, allow: list[str]):
        self.mode = mode
        self.unix = False
        self.nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for entry in allow:
            for item in (e.strip() for e in entry.split(",")):
                if not item:
                    continue
                if item == "unix":
                    self.unix = True
                elif item == "*":
                    self.unix = True
                    self.nets += [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")]
                else:
                    self.nets.append(parse_net(item))
        self._logged = 0.0
        self._unlogged = 0

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def native(self) -> list[tuple[bytes, int]]:
        """The nets as the engine's set_proxy takes them."""
        return [(n.network_address.packed, n.prefixlen) for n in self.nets]

    def allowed(self, peer) -> bool:
        """Whether a stream connection's peer (socket.getpeername()'s) may,
        and so must, send a header."""
        if not isinstance(peer, tuple):
            return self.unix                    # a unix socket's peer: "" or a path
        addr = ipaddress.ip_address(peer[0].split("%")[0])
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped             # a v4 client of a dual-stack listener
        return any(addr in n for n in self.nets)

    def refused(self, peer, reason: str) -> None:
        """A stream connection closed over its header: logged at most once
        a second per worker (the engine's refusal log does the same)."""
        self._unlogged += 1
        now = time.monotonic()
        if self._logged and now - self._logged < 1.0:
            return
        log_closed(peer, reason, self._unlogged)
        self._logged = now
        self._unlogged = 0


def parse_net(item: str):
    """An address or CIDR of proxy_allow_from; ValueError naming it."""
    try:
        return ipaddress.ip_network(item, strict=False)
    except ValueError:
        raise ValueError(f"proxy_allow_from: {item!r} is not an address, a CIDR, "
                         "'unix' or '*'") from None


def check_allow(entries: list[str]) -> None:
    """Validates proxy_allow_from (the settings' check, before any worker)."""
    Policy("off", entries)


def log_closed(peer, reason: str, count: int) -> None:
    who = "%s:%s" % peer[:2] if isinstance(peer, tuple) else (peer or "unix socket")
    more = f" ({count} refused since the last line)" if count > 1 else ""
    log.warning("closed the connection from %s: %s%s", who, reason, more)


