"""Trusted proxy headers (issue 24 §1): the settings forwarded_allow_ips,
secure_scheme_headers and forwarder_headers read once (`parse`: the master
checks them before anything binds, master/settings.py), and handed to a
worker's native engine (`install`), which decides per connection whether
its peer is trusted and, for a trusted one only, reads the forwarding
fields of each request (worker/native/conn/forwarded.h says how and what it
costs).

Each list item may itself be comma-separated: `--forwarded-allow-ips
10.0.0.1,10.0.0.2` is gunicorn's and uvicorn's spelling. The allow list is
read as proxy_allow_from's is (worker/netmatch.py).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from sockherd.worker import netmatch

log = logging.getLogger("sockherd.forwarded")

DEFAULT_ALLOW = ["127.0.0.1", "::1"]
# gunicorn's secure_scheme_headers default
DEFAULT_SCHEME = ["X-Forwarded-Protocol=ssl", "X-Forwarded-Proto=https", "X-Forwarded-Ssl=on"]
# forwarder_headers: the field, its bit in worker/native/conn/forwarded.h
FORWARDER = {"x-forwarded-host": 1, "x-forwarded-port": 2, "x-forwarded-prefix": 4}
MAX_SCHEME = 8                       # worker/native/proto/http1/fwd_fields.c: seen.scheme_last

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


class ForwardedError(ValueError):
    """A bad forwarding setting: the message names it and the value."""


@dataclass(frozen=True)
class Rules:
    nets: tuple                      # ipaddress networks
    all: bool
    unix: bool
    scheme: tuple                    # (lower-case field name, value meaning https)
    forwarder: int                   # FORWARDER bits

    @property
    def on(self) -> bool:
        return self.all or self.unix or bool(self.nets)


def parse(allow, scheme, forwarder) -> Rules:
    """The three settings' values (lists of str) as Rules; ForwardedError
    names the first bad item."""
    try:
        peers = netmatch.parse("forwarded_allow_ips", allow)
    except ValueError as exc:
        raise ForwardedError(str(exc)) from None
    pairs = []
    for item in netmatch.items(scheme):
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not _TOKEN.match(name) or not value or not _TOKEN.match(value):
            raise ForwardedError(f"secure_scheme_headers: {item!r} is not HEADER=VALUE "
                                 f"(e.g. X-Forwarded-Proto=https)")
        pairs.append((name.lower(), value))
    if len(pairs) > MAX_SCHEME:
        raise ForwardedError(f"secure_scheme_headers: {len(pairs)} headers, at most {MAX_SCHEME}")
    bits = 0
    for item in netmatch.items(forwarder):
        if item.lower() not in FORWARDER:
            raise ForwardedError(f"forwarder_headers: {item!r} is not one of "
                                 f"X-Forwarded-Host, X-Forwarded-Port, X-Forwarded-Prefix")
        bits |= FORWARDER[item.lower()]
    return Rules(peers.nets, peers.all, peers.unix, tuple(pairs), bits)


def from_config(cfg: dict) -> Rules:
    return parse(cfg.get("forwarded_allow_ips", DEFAULT_ALLOW),
                 cfg.get("secure_scheme_headers", DEFAULT_SCHEME),
                 cfg.get("forwarder_headers", []))


def install(engine, rules: Rules) -> None:
    """Hands the rules to a native Server before its first connection."""
    peers = netmatch.Allow(rules.nets, rules.all, rules.unix)
    engine.set_forwarded(
        peers.packed(), peers.all, peers.unix,
        [(name.encode("ascii"), value.encode("ascii")) for name, value in rules.scheme],
        rules.forwarder, _ignored)


def _ignored(peer, field: str, value: bytes) -> None:
    """A forwarding field from a trusted peer whose value did not parse:
    ignored (the request is served as if it were absent), said at debug."""
    if log.isEnabledFor(logging.DEBUG):
        who = "%s:%s" % peer if isinstance(peer, tuple) else (peer or "unix socket")
        log.debug("ignored a malformed %s from %s: %r", field, who, value[:200])
