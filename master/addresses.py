"""What a `bind` address says, before anything is bound.

Five forms, as gunicorn, HAProxy, nginx and systemd operators write them:

    host:port        127.0.0.1:8000, localhost:80, 0.0.0.0:8000, :8000 (all IPv4)
    [v6]:port        [::1]:8000, [::]:8000
    unix:/path       a unix stream socket at an absolute path
    fd://N           an already-listening socket inherited as fd N
    systemd:NAME     the socket systemd passed (socket activation) under the name
                     NAME: the .socket unit's FileDescriptorName= (default: the
                     unit's name, e.g. app.socket), i.e. LISTEN_FDNAMES. A name is
                     1 to 255 printable ASCII characters without ':' (systemd's
                     rule). If no passed socket has that name, the master does
                     not start (exit 1) and a reload naming it is refused.

With socket activation, any `bind` entry that is an activated socket (by name
as systemd:NAME, by number as fd://N, or by address: host:port or unix:/path
equal to the address the socket is bound to, 0.0.0.0:P also matching a
dual-stack [::]:P) is served by that socket and never bound a second time; an
activated socket that no entry names is served too (master/listeners.py
claim_activated).

A `bind` entry may start with a scheme: `tls://` (served with TLS: the
certfile's) or `tcp://` (plain). parse() takes it off; master/tls_binds.py
says which listeners serve TLS (with no entry marked, every one does when
certfile is set). Other addresses (--metrics) are parsed with scheme_ok=False.

Parsing is pure (no DNS, no syscalls): a host name stays a name, resolved when
the listener is bound. A bad address raises AddressError naming the address
and what is wrong with it.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal

_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
# sun_path is 108 bytes including the terminating NUL
UNIX_PATH_MAX = 107
# systemd's FDNAME_MAX (fdname_is_valid(): printable ASCII, no ':', 1..255 characters)
FDNAME_MAX = 255


class AddressError(ValueError):
    """A bind address that cannot mean anything."""


@dataclass(frozen=True)
class Address:
    kind: Literal["tcp", "unix", "fd", "systemd"]
    host: str = ""          # tcp: IPv4/IPv6 literal or a name; "" never (":8000" -> 0.0.0.0)
    port: int = 0           # tcp: 0 asks the kernel for an ephemeral port
    path: str = ""          # unix
    fd: int = -1            # fd
    name: str = ""          # systemd: the FileDescriptorName= of an activated socket

    def __str__(self) -> str:
        if self.kind == "unix":
            return f"unix:{self.path}"
        if self.kind == "fd":
            return f"fd://{self.fd}"
        if self.kind == "systemd":
            return f"systemd:{self.name}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _port(text: str, address: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise AddressError(f"{address!r}: port {text!r} is not a number from 0 to 65535")
    return int(text)


SCHEMES = {"tls://": True, "tcp://": False}


def scheme(address: str) -> tuple[bool | None, str]:
    """(True for tls://, False for tcp://, None for no scheme; the rest)."""
    for prefix, tls in SCHEMES.items():
        if address.startswith(prefix):
            return tls, address[len(prefix):]
    return None, address


def parse(address: str, *, scheme_ok: bool = True) -> Address:
    """Parses one bind address (its tls:// or tcp:// scheme taken off when
    scheme_ok). Raises AddressError."""
    tls, rest = scheme(address)
    if tls is not None:
        if not scheme_ok:
            raise AddressError(f"{address!r}: a tls:// or tcp:// scheme is for `bind` entries")
        address = rest
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        if path.startswith("//"):       # unix:///run/x.sock, as a URL would write it
            path = path[2:]
        if not path.startswith("/"):
            raise AddressError(f"{address!r}: a unix socket path must be absolute")
        if "\0" in path:
            raise AddressError(f"{address!r}: a unix socket path cannot hold a NUL byte")
        if len(path.encode()) > UNIX_PATH_MAX:
            raise AddressError(f"{address!r}: path longer than {UNIX_PATH_MAX} bytes (sun_path)")
        return Address("unix", path=path)
    if address.startswith("fd://"):
        num = address[len("fd://"):]
        if not num.isdigit():
            raise AddressError(f"{address!r}: fd://N takes a file descriptor number")
        return Address("fd", fd=int(num))
    if address.startswith("systemd:"):
        name = address[len("systemd:"):]
        if not name or len(name) > FDNAME_MAX:
            raise AddressError(f"{address!r}: systemd:NAME takes the name of a socket systemd "
                               f"passes (FileDescriptorName=), 1 to {FDNAME_MAX} characters")
        if not all(" " <= ch <= "~" and ch != ":" for ch in name):
            raise AddressError(f"{address!r}: a systemd socket name is printable ASCII "
                               "without ':'")
        return Address("systemd", name=name)
    if address.startswith("["):
        host, sep, port = address[1:].partition("]:")
        if not sep:
            raise AddressError(f"{address!r}: an IPv6 address is written [address]:port")
        try:
            ip = ipaddress.IPv6Address(host)
        except ValueError:
            raise AddressError(f"{address!r}: {host!r} is not an IPv6 address") from None
        return Address("tcp", host=str(ip), port=_port(port, address))
    host, sep, port = address.rpartition(":")
    if not sep:
        raise AddressError(f"{address!r}: expected host:port, [v6]:port, unix:/path, fd://N "
                           "or systemd:NAME")
    if ":" in host:
        raise AddressError(f"{address!r}: write an IPv6 address in brackets, [address]:port")
    if not host:
        host = "0.0.0.0"
    elif not _HOSTNAME.match(host):
        raise AddressError(f"{address!r}: {host!r} is not a host name or IPv4 address")
    return Address("tcp", host=host, port=_port(port, address))
