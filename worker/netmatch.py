"""Allow lists of peers, one way for both settings that have one:
forwarded_allow_ips (worker/forwarded.py: whose forwarding fields are
believed) and proxy_allow_from (worker/proxy.py: who may send a PROXY
header).

An item is an address or CIDR network (`10.0.0.0/8`, `::1`), `*` (every
peer) or `unix` (peers of unix-socket listeners; `unix:` too, any case);
each item may itself be comma-separated (`--forwarded-allow-ips
10.0.0.1,10.0.0.2` is gunicorn's and uvicorn's spelling). A v4-mapped
network is kept as its IPv4 one, since a dual-stack socket's v4-mapped
peer is compared as IPv4 (here and in worker/native/netmatch.c, which
matches the engine's connections against the same networks).

This module imports no native code: the master checks the settings with
it before anything binds.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

UNIX = ("unix", "unix:")


def items(values) -> list[str]:
    """A list setting's items, each comma-separated one split, blanks dropped."""
    return [v.strip() for item in values for v in str(item).split(",") if v.strip()]


@dataclass(frozen=True)
class Allow:
    nets: tuple                      # ipaddress networks
    all: bool                        # "*"
    unix: bool                       # "unix"

    def packed(self) -> list[tuple[bytes, int]]:
        """The networks as the engine's set_forwarded and set_proxy take them."""
        return [(n.network_address.packed, n.prefixlen) for n in self.nets]

    def allows(self, peer) -> bool:
        """Whether a peer as socket.getpeername() gives it is allowed (a
        unix socket's peer: "" or a path)."""
        if self.all:
            return True
        if not isinstance(peer, tuple):
            return self.unix
        addr = ipaddress.ip_address(peer[0].split("%")[0])
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped             # a v4 client of a dual-stack listener
        return any(addr in n for n in self.nets)


def parse(setting: str, values) -> Allow:
    """The setting's values (a list of str) as an Allow; ValueError naming
    the setting and its first bad item."""
    nets, every, unix = [], False, False
    for item in items(values):
        if item == "*":
            every = True
        elif item.lower() in UNIX:
            unix = True
        else:
            try:
                net = ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{setting}: {item!r} is not an address, a CIDR network, "
                                 f"'*' or 'unix'") from None
            mapped = net.version == 6 and net.prefixlen >= 96 and net.network_address.ipv4_mapped
            if mapped:
                net = ipaddress.ip_network(f"{mapped}/{net.prefixlen - 96}")
            nets.append(net)
    return Allow(tuple(nets), every, unix)
