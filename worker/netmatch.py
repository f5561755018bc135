"""Allow lists of peers, one way for both settings that have one:
forwarded_allow_ips (worker/forwarded.py: whose forwarding fields are
believed) and proxy_allow_from (worker/proxy.py: who may send a PROXY
header).

An item is an address or CIDR network (`10.0.0.0/8`, `::1`), `*` (every
peer) or `unix` (peers of unix-socket listeners; `unix:` too, any case);
each item may itself be comma-separated (`--forwarded-allow-ips
10.0.0.1,10.0.0.2` is gunicorn's and uvicorn's spelling). A v4-mapped
network is kept as its IPv4 one, since a dual-stack socket's v4-mapped
peer is compared as IPv4 (here and in worker/native/parse/netmatch.c, which
matches the engine's connections against the same networks). An IPv6
link-local entry may name its zone (`fe80::1%eth0`, or `%4`, the
interface's index): it then allows that address on that interface only,
as the same fe80::1 may be another host on another link; without a zone
it allows it on every interface. A zone on any other address, or one that
names no interface of this host, is refused.

This module imports no native code: the master checks the settings with
it before anything binds.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field

UNIX = ("unix", "unix:")


def items(values) -> list[str]:
    """A list setting's items, each comma-separated one split, blanks dropped."""
    return [v.strip() for item in values for v in str(item).split(",") if v.strip()]


@dataclass(frozen=True)
class Allow:
    nets: tuple                      # ipaddress networks
    all: bool                        # "*"
    unix: bool                       # "unix"
    # each network's zone as an interface index (0: none), resolved once
    # here, as the engine gets it once (packed): looked up per connection
    # (allows), an interface gone after the start raised OSError in the
    # accept path and a loop thread died (issue 35 review of point 24)
    zones: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "zones", tuple(zone_index(n) for n in self.nets))

    def packed(self) -> list[tuple]:
        """The networks as the engine's set_forwarded and set_proxy take
        them: (address bytes, prefix length[, a zone's interface index])."""
        return [(n.network_address.packed, n.prefixlen) + ((z,) if z else ())
                for n, z in zip(self.nets, self.zones)]

    def allows(self, peer) -> bool:
        """Whether a peer as socket.getpeername() gives it is allowed (a
        unix socket's peer: "" or a path; an IPv6 one's scope id, its
        interface, fourth)."""
        if self.all:
            return True
        if not isinstance(peer, tuple):
            return self.unix
        addr = ipaddress.ip_address(peer[0].split("%")[0])
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped             # a v4 client of a dual-stack listener
        scope = peer[3] if len(peer) > 3 else 0
        return any(addr in n and z in (0, scope) for n, z in zip(self.nets, self.zones))


def zone_index(net) -> int:
    """The interface index of a network's zone (`%eth0`, `%4`), 0 if none;
    OSError when no interface has that name."""
    zone = getattr(net.network_address, "scope_id", None)
    if not zone:
        return 0
    return int(zone) if zone.isdigit() else socket.if_nametoindex(zone)


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
            if getattr(net.network_address, "scope_id", None):
                _check_zone(setting, item, net)
            mapped = net.version == 6 and net.prefixlen >= 96 and net.network_address.ipv4_mapped
            if mapped:
                net = ipaddress.ip_network(f"{mapped}/{net.prefixlen - 96}")
            nets.append(net)
    return Allow(tuple(nets), every, unix)


def _check_zone(setting: str, item: str, net) -> None:
    """A zone names the link of a link-local address: the kernel tells a
    peer's interface (its scope id) for those only, so a zone elsewhere
    would match nothing; and it must name an interface of this host."""
    if not net.network_address.is_link_local:
        raise ValueError(f"{setting}: {item!r}: a zone (%name) names the interface of a "
                         f"link-local address (fe80::/10) only")
    try:
        index = zone_index(net)
    except OSError:
        raise ValueError(f"{setting}: {item!r}: no network interface "
                         f"{net.network_address.scope_id!r} on this host") from None
    if not 0 < index < 1 << 32:
        raise ValueError(f"{setting}: {item!r}: interface index {index} out of range")
