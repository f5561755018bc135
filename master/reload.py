"""What a reload changes, worked out before any worker starts.

A reload (SIGHUP) re-reads the settings and starts a new generation of
workers on the listeners those settings name. The listeners are reconciled
here: an address that stays is the same kernel socket (never re-bound: no
gap, same inode, the same accept queue); an address that is new is bound
now, and a bind failure refuses the whole reload (what this attempt bound is
closed again); an address that goes is closed by the supervisor once the new
generation serves (the old one, draining, has stopped polling it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sockherd.master.addresses import AddressError, parse
from sockherd.master.listeners import BindError, Listener, bind, set_keepalive


class Refused(Exception):
    """A reload that cannot go ahead: the message says why."""


@dataclass
class Pending:
    """A reload under way: the new generation, until all of it is READY."""
    generation: int
    settings: object
    config: dict
    listeners: list[Listener]
    added: list[Listener]            # bound for it: closed again if it is refused
    slots: list = field(default_factory=list)
    started: float = 0.0

    def abandon(self) -> None:
        """The reload is refused: what it bound is closed."""
        for lst in self.added:
            lst.close()
        self.added = []


def _same_socket(address, bound: dict[str, Listener]) -> Listener | None:
    """The listener among `bound` (by its kernel address) that a TCP
    address with a fixed port resolves to, if any."""
    import socket

    from sockherd.ipc.listeners import format_address

    if address.kind != "tcp" or not address.port or not bound:
        return None
    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except OSError:
        return None                                   # the bind says why
    for family, _, _, _, sockaddr in infos:
        found = bound.get(format_address(family, sockaddr[:2]))
        if found is not None:
            return found
    return None


def reconcile(current: list[Listener], activated: list[Listener], settings) -> tuple[
        list[Listener], list[Listener]]:
    """The listeners of `settings`: (all of them, the ones bound now). The
    systemd-activated ones always stay (they are not in `bind`); one of
    `current` whose address is asked again is reused. Raises Refused."""
    keep = {lst.address: lst for lst in current if lst not in activated}
    # ... and by the address the kernel bound: `localhost:8000` then
    # `127.0.0.1:8000` is the same socket (a fixed port only: port 0 asks
    # for a new one each time, so only its spelling can match)
    bound = {lst.descriptor.address: lst for lst in keep.values()}
    out, added = list(activated), []
    try:
        for text in settings.bind:
            try:
                address = parse(text)
            except AddressError as exc:
                raise Refused(f"bind {text!r}: {exc}") from None
            same = keep.get(address) or _same_socket(address, bound)
            if same is not None:
                if same not in out:
                    out.append(same)
                continue
            try:
                lst = bind(text, backlog=settings.backlog, unix_mode=settings.unix_mode,
                           unix_owner=settings.unix_owner)
            except (BindError, OSError) as exc:
                # BindError's message names the address; a bare OSError's does not
                raise Refused(exc.strerror if isinstance(exc, BindError) and exc.strerror
                              else f"bind {text}: {exc}") from None
            added.append(lst)
            out.append(lst)
    except BaseException:
        for lst in added:
            lst.close()
        raise
    if not out:
        raise Refused("no listener left to serve")
    set_keepalive(out, settings.tcp_keepalive)     # a reload may change it (new accepts)
    return out, added
