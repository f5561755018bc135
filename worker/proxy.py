"""The PROXY protocol in the worker: who may send a header (proxy_allow_from)
and the stream interface's use of the native parser.

The header itself is parsed in native code (worker/native/parse/proxy_proto.c):
for HTTP inside the engine's connection layer (conn_proxy.c), for the
stream interface by stream.Connection (the module's proxy_parse), the same
parser either way. This module imports no native code: the master checks
the setting with it.

proxy_allow_from entries: an address or CIDR (`10.0.0.0/8`, `::1`), `unix`
(peers of unix-socket listeners), or `*` (every peer), read as
forwarded_allow_ips's are (worker/netmatch.py). The default is
loopback and unix sockets: a proxy on the same host (deploy/'s HAProxy, a
sidecar) works with no setting, and no remote peer can name a client
unless the operator lists it (a header from a peer not listed is refused,
since it could name any client it likes).
"""
from __future__ import annotations

import logging
import time

from sockherd.worker import netmatch

log = logging.getLogger("sockherd.worker")

DEFAULT_ALLOW = ["127.0.0.0/8", "::1", "unix"]


class Policy:
    """proxy_protocol and proxy_allow_from, parsed once per worker."""

    def __init__(self, mode: str, allow: list[str]):
        self.mode = mode
        self.allow = netmatch.parse("proxy_allow_from", allow)
        self._logged = 0.0
        self._unlogged = 0

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def allowed(self, peer) -> bool:
        """Whether a stream connection's peer (socket.getpeername()'s) may,
        and so must, send a header."""
        return self.allow.allows(peer)

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


def check_allow(entries: list[str]) -> None:
    """Validates proxy_allow_from (the settings' check, before any worker)."""
    Policy("off", entries)


def log_closed(peer, reason: str, count: int) -> None:
    who = "%s:%s" % peer[:2] if isinstance(peer, tuple) else (peer or "unix socket")
    more = f" ({count} refused since the last line)" if count > 1 else ""
    log.warning("closed the connection from %s: %s%s", who, reason, more)


