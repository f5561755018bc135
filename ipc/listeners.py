"""Listener descriptors: what a passed listening fd claims to be, and the check of that claim.

An fd number alone says nothing: after a bug, a race or a malicious peer it may be a
different socket, a pipe, or a socket bound elsewhere. So every listener travels with a
descriptor built from the live socket (never from config, which may say "port 0"), and
the receiver compares the fd it got against it before using it. A mismatch closes every fd
of the batch: half-adopted listener sets are how listeners leak.
"""

import fcntl
import os
import socket
import stat
from typing import Literal

import msgspec

from .errors import ListenerMismatch
from .fds import borrowed_socket, close_all

Family = Literal["unix", "inet", "inet6"]
SockType = Literal["stream", "dgram", "seqpacket"]

_FAMILIES = {socket.AF_UNIX: "unix", socket.AF_INET: "inet", socket.AF_INET6: "inet6"}
_TYPES = {socket.SOCK_STREAM: "stream", socket.SOCK_DGRAM: "dgram",
          socket.SOCK_SEQPACKET: "seqpacket"}


class ListenerDescriptor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A listener as seen by getsockname(): `address` is "host:port", "[v6host]:port",
    a filesystem path, or "@name" for an abstract unix socket. `options` carries the
    settings it was bound with (backlog, reuseport, ...) for the receiver's information."""

    name: str
    family: Family
    address: str
    type: SockType = "stream"
    options: dict[str, int | bool | str] = {}


def format_address(family: int, sockname) -> str:
    """getsockname() result as the text a descriptor carries."""
    if family == socket.AF_INET:
        return f"{sockname[0]}:{sockname[1]}"
    if family == socket.AF_INET6:
        return f"[{sockname[0]}]:{sockname[1]}"
    if isinstance(sockname, bytes):  # abstract namespace: leading NUL
        return "@" + sockname[1:].decode("utf-8", "surrogateescape")
    return sockname


def describe(sock: socket.socket, name: str, options=None) -> ListenerDescriptor:
    """Descriptor of a live socket, read back from the kernel."""
    return ListenerDescriptor(
        name=name,
        family=_FAMILIES[sock.family],
        address=format_address(sock.family, sock.getsockname()),
        type=_TYPES[sock.type],
        options=dict(options or {}),
    )


def check(fd: int, desc: ListenerDescriptor) -> None:
    """Raise ListenerMismatch unless fd is the socket desc describes. Closes nothing."""
    where = f"listener {desc.name!r}: fd {fd}"
    try:
        mode = os.fstat(fd).st_mode
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError as exc:
        raise ListenerMismatch(f"{where} is not open ({exc.strerror})") from None
    # fstat() works on an O_PATH fd and reports what the path is, so an O_PATH fd of a
    # socket file passes S_ISSOCK; but it is a reference to the path, no socket, and every
    # socket call on it fails with EBADF.
    if flags & os.O_PATH:
        what = _kind(fd, mode)
        if stat.S_ISSOCK(mode):
            raise ListenerMismatch(f"{where} is an O_PATH reference to {what}, not an open socket")
        raise ListenerMismatch(f"{where} is an O_PATH reference to {what}, not a socket")
    if not stat.S_ISSOCK(mode):
        raise ListenerMismatch(f"{where} is {_kind(fd, mode)}, not a socket")
    try:
        _check_socket(fd, desc, where)
    except OSError as exc:
        # The fd changed under us (another thread closed or replaced it) or the kernel
        # refused a probe: still a mismatch, never a bare OSError to the caller.
        raise ListenerMismatch(f"{where} cannot be probed as a socket ({exc.strerror})") from None


def _check_socket(fd: int, desc: ListenerDescriptor, where: str) -> None:
    with borrowed_socket(fd) as sock:
        family = _FAMILIES.get(sock.family, str(sock.family))
        if family != desc.family:
            raise ListenerMismatch(f"{where} is an {family} socket, descriptor says {desc.family}")
        kind = _TYPES.get(sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE), "other")
        if kind != desc.type:
            raise ListenerMismatch(f"{where} is a {kind} socket, descriptor says {desc.type}")
        if kind != "dgram" and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise ListenerMismatch(f"{where} is not listening")
        address = format_address(sock.family, sock.getsockname())
        if address != desc.address:
            raise ListenerMismatch(f"{where} is bound to {address}, descriptor says {desc.address}")


_KINDS = [(stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file"),
          (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a pipe"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISLNK, "a symbolic link")]


def _kind(fd: int, mode: int) -> str:
    """What fd is, for an error message: the file type, and what /proc says it points to
    (a path, "pipe:[...]", "anon_inode:[eventfd]"...)."""
    what = next((name for test, name in _KINDS if test(mode)), "an anonymous inode")
    try:
        return f"{what} ({os.readlink(f'/proc/self/fd/{fd}')})"
    except OSError:
        return what


def adopt(descs, fds) -> list[socket.socket]:
    """Check every fd against its descriptor and wrap them as socket objects (taking
    ownership). On any mismatch every fd is closed and ListenerMismatch is raised."""
    fds = list(fds)
    socks: list[socket.socket] = []
    try:
        if len(descs) != len(fds):
            raise ListenerMismatch(f"{len(descs)} listener descriptors but {len(fds)} fds")
        for desc, fd in zip(descs, fds):
            check(fd, desc)
        for desc, fd in zip(descs, fds):
            try:
                socks.append(socket.socket(fileno=fd))
            except OSError as exc:
                raise ListenerMismatch(f"listener {desc.name!r}: fd {fd} cannot be adopted "
                                       f"as a socket ({exc.strerror})") from None
    except BaseException:
        # All or nothing: a half-adopted listener set is how listeners leak.
        for sock in socks:
            sock.close()
        close_all(fds[len(socks):])
        raise
    return socks
