"""Which listeners serve TLS: every `bind`, or the ones marked tls://.

With certfile set and no `bind` entry marked, every listener serves TLS
(as before per-bind TLS existed). An entry marked `tls://` (HAProxy's
`bind :443 ssl`, nginx's `listen 443 ssl`) serves TLS; once any entry
carries a scheme, an entry without one (or with `tcp://`) is plain:

    --certfile c.pem --bind tls://0.0.0.0:8443 --bind 0.0.0.0:8080

Rules (checked with the settings: a start exits 2, a reload is refused):
  - a tls:// entry without certfile names that entry;
  - certfile with every entry marked plain serves no TLS: refused too, as
    every other TLS setting that would be silently unused;
  - one address spelled both ways is refused (it is one socket);
  - tls://systemd:NAME is refused: systemd's sockets are claimed before
    the generation sees its `bind` (cli.py own()); leave the entries
    unmarked with socket activation (every one TLS) or terminate in front;
  - a unix socket may be TLS (the engine does not care what carries it).

The TLS-ness is the generation's, not the socket's: a listener kept by a
reload (the same kernel socket, master/reload.py) serves what the new
settings say from the new generation on, while the old generation drains
with what it had (its connections keep their scheme). So it is worked out
for each worker at its spawn, from its generation's settings and
listeners (flags), and travels in its assignment (TLS_LISTENERS).
"""
from __future__ import annotations

from typing import Any

from sockherd.master.addresses import AddressError, parse, scheme

TLS_LISTENERS = "tls_listeners"        # the assignment's key (not a setting): a bool per listener


class BindTlsError(ValueError):
    """A `bind` marking that cannot be served (the message names the entry)."""


def marked(binds: list[str]) -> bool:
    """Whether some entry carries a scheme: then only tls:// ones are TLS."""
    return any(scheme(b)[0] is not None for b in binds)


def check(s: Any) -> None:
    """Raises BindTlsError unless the `bind` markings can be served."""
    tls = [b for b in s.bind if scheme(b)[0]]
    if tls and not s.certfile:
        raise BindTlsError(f"bind {tls[0]}: tls:// needs certfile (and keyfile): no "
                           f"certificate to serve it with")
    if not marked(s.bind):
        return
    if s.certfile and not tls:
        raise BindTlsError(f"certfile is set but every bind is marked plain (tcp://): no "
                           f"bind serves TLS; mark one tls:// (e.g. tls://0.0.0.0:8443) or "
                           f"leave certfile empty")
    seen: dict = {}
    for text in s.bind:
        on, rest = scheme(text)
        if on and rest.startswith("systemd:"):
            raise BindTlsError(f"bind {text}: TLS per bind is for addresses sockherd binds "
                               f"(or fd://N); with socket activation leave the binds "
                               f"unmarked (every one TLS with certfile)")
        try:
            address = parse(text)
        except AddressError:
            continue                          # the address check says what is wrong
        other = seen.setdefault(address, (bool(on), text))
        if other[0] != bool(on):
            raise BindTlsError(f"bind {text} and bind {other[1]}: one address, both TLS and "
                               f"plain")


def _serves(text: str, lst) -> bool:
    """Whether `bind` entry text names listener lst: as configured, or by
    its kernel address, fd number or systemd name (claim_activated's
    matching, which a reload's reuse of a socket follows)."""
    from sockherd.master.listeners import claim_activated

    try:
        if parse(text) == lst.address:
            return True
    except AddressError:
        return False
    return claim_activated(text, [lst]) is lst


def flags(settings: Any, listeners: list) -> list[bool]:
    """A bool per listener (in order): served with TLS by a worker of the
    generation whose settings these are."""
    if not settings.certfile:
        return [False] * len(listeners)
    if not marked(settings.bind):
        return [True] * len(listeners)
    tls = [b for b in settings.bind if scheme(b)[0]]
    return [any(_serves(t, lst) for t in tls) for lst in listeners]
