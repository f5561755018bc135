"""The master's listening sockets: bound (or adopted) once, kept for its whole life.

Every socket is close-on-exec and non-blocking; the master passes it to workers
explicitly (SCM_RIGHTS), never by inheritance. Never SO_REUSEPORT: one accept
queue shared by every worker of every generation is what makes a reload lose
nothing (with per-worker queues, connections queued on a worker that exits are
reset). SO_REUSEADDR only, so a restart does not wait for TIME_WAIT.

A unix socket path that already exists is replaced only if it is a socket and
nothing answers on it (a stale file left by a crash); a live server there, or a
file that is not a socket, is an error.
"""
from __future__ import annotations

import errno
import grp
import os
import pwd
import socket
import stat
from dataclasses import dataclass

from sockherd.ipc.listeners import ListenerDescriptor, describe
from sockherd.master.addresses import Address, parse


class BindError(OSError):
    """A listener that could not be bound or adopted; the message names the address."""


@dataclass
class Listener:
    address: Address          # as configured
    sock: socket.socket       # live, listening, CLOEXEC, non-blocking
    descriptor: ListenerDescriptor
    created_path: str = ""    # unix: the file we created (removed at close)
    inode: int = 0            # ... and its inode, so we never remove a successor's
    handed_to: int = 0        # a takeover's new instance (pid), which serves it too

    def close(self) -> None:
        if self.sock.fileno() == -1:
            return                    # closed already (a stop closes, then run() again)
        if self.created_path and not (self.handed_to and _holds(self.handed_to, self.sock)):
            try:
                st = os.lstat(self.created_path)
                if stat.S_ISSOCK(st.st_mode) and st.st_ino == self.inode:
                    os.unlink(self.created_path)
            except OSError:
                pass
        self.sock.close()


def _holds(pid: int, sock: socket.socket) -> bool:
    """Whether process pid has this very socket open (a takeover's new
    instance: its file is the new instance's to remove, unless that one died
    after taking it, and then ours again; review)."""
    try:
        target = f"socket:[{os.fstat(sock.fileno()).st_ino}]"
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


def _fail(address: Address, what: str, exc: OSError | None = None) -> BindError:
    code = exc.errno if exc else errno.EINVAL
    reason = f": {exc.strerror}" if exc else ""
    return BindError(code, f"bind {address}: {what}{reason}")


def _tcp(address: Address, backlog: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE | socket.AI_NUMERICSERV)
    except socket.gaierror as exc:
        raise BindError(errno.EINVAL, f"bind {address}: cannot resolve {address.host!r}: "
                                      f"{exc.strerror}") from None
    family, _, _, _, sockaddr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            # [::]:port is IPv6 only, as nginx does: bind 0.0.0.0 too for IPv4
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise _fail(address, "cannot listen", exc) from None
    return sock


def _clear_stale(address: Address) -> None:
    """Removes a stale unix socket file at the path; raises if it is not stale."""
    path = address.path
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise _fail(address, "the path exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)            # nothing listens: a leftover of a dead server
        return
    except OSError as exc:
        raise _fail(address, "cannot tell whether the socket file is stale", exc) from None
    finally:
        probe.close()
    raise _fail(address, "another server is listening on it")


def _unix(address: Address, backlog: int, mode: int, owner: str) -> socket.socket:
    _clear_stale(address)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(address.path)
    except OSError as exc:
        sock.close()
        raise _fail(address, "cannot bind", exc) from None
    try:
        os.chmod(address.path, mode)
        if owner:
            user, _, group = owner.partition(":")
            uid = pwd.getpwnam(user).pw_uid if user else -1
            gid = grp.getgrnam(group).gr_gid if group else -1
            os.chown(address.path, uid, gid)
        sock.listen(backlog)
    except KeyError as exc:
        sock.close()
        os.unlink(address.path)
        raise BindError(errno.EINVAL, f"bind {address}: unknown user or group {exc.args[0]}") from None
    except OSError as exc:
        sock.close()
        os.unlink(address.path)
        raise _fail(address, "cannot set up the socket file", exc) from None
    return sock


def _inherited(address: Address) -> socket.socket:
    try:
        sock = socket.socket(fileno=address.fd)
    except OSError as exc:
        raise _fail(address, "not an open socket", exc) from None
    try:
        if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET,
                                                                  socket.SO_ACCEPTCONN):
            raise _fail(address, "not a listening stream socket")
        os.set_inheritable(address.fd, False)
    except BindError:
        sock.detach()              # not ours to close: the caller handed it over
        raise
    return sock


def bind(text: str, *, name: str = "", backlog: int = 2048, unix_mode: str = "0666",
         unix_owner: str = "") -> Listener:
    """Binds (or adopts, for fd://N) one address. Raises AddressError or BindError."""
    address = parse(text)
    created = ""
    if address.kind == "systemd":
        # claim_activated() takes every entry an activated socket serves out
        # of `bind` first: one that gets here names no socket systemd passed
        raise BindError(errno.ENOENT, f"bind {address}: systemd passed no socket named "
                                      f"{address.name!r} (the .socket unit's "
                                      "FileDescriptorName=, LISTEN_FDNAMES)")
    if address.kind == "tcp":
        sock = _tcp(address, backlog)
    elif address.kind == "unix":
        sock = _unix(address, backlog, int(unix_mode, 8), unix_owner)
        created = address.path
    else:
        sock = _inherited(address)
    sock.setblocking(False)
    return Listener(address, sock, describe(sock, name or str(address), {"backlog": backlog}),
                    created, os.lstat(created).st_ino if created else 0)


def set_keepalive(listeners: list[Listener], idle: int) -> None:
    """TCP keep-alive on each TCP listener (issue 35, point 27): SO_KEEPALIVE,
    TCP_KEEPIDLE idle, TCP_KEEPINTVL max(1, idle // 4), TCP_KEEPCNT 4; idle 0
    turns it off. One setsockopt per listener, none per accept: Linux copies
    a listener's socket options into each connection it accepts
    (inet_csk_clone_lock; tests/master/test_tcp_keepalive.py shows it with
    `ss -o`). Unix listeners have no keep-alive and are left alone; an
    inherited socket that refuses the options is logged, not fatal."""
    import logging

    for lst in listeners:
        sock = lst.sock
        if sock.fileno() == -1 or sock.family not in (socket.AF_INET, socket.AF_INET6):
            continue
        try:
            if idle:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, idle // 4))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 4)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1 if idle else 0)
        except OSError as exc:
            logging.getLogger("sockherd.master").warning(
                "tcp_keepalive on %s: %s", lst.descriptor.address, exc.strerror or exc)


def bind_all(settings) -> list[Listener]:
    """Every `bind` of the settings, all or nothing: on a failure the ones
    already bound are closed (and their socket files removed)."""
    done: list[Listener] = []
    try:
        for text in settings.bind:
            done.append(bind(text, backlog=settings.backlog, unix_mode=settings.unix_mode,
                             unix_owner=settings.unix_owner))
    except BaseException:
        for listener in done:
            listener.close()
        raise
    return done


def activated() -> list[Listener]:
    """The listening sockets systemd passed us (socket activation: LISTEN_FDS
    for our pid), [] if none; the variables are removed from the environment
    either way, so no worker mistakes them for its own. Raises
    ActivationError for a malformed environment or an fd that is not a
    listening socket (all of them closed then)."""
    from sockherd.ipc import systemd

    out = []
    for desc, sock in systemd.adopt(systemd.listen_fds(unset_environment=True)):
        sock.setblocking(False)
        out.append(Listener(parse(f"fd://{sock.fileno()}"), sock, desc))
    return out


def claim_activated(text: str, activated: list[Listener]) -> Listener | None:
    """The activated socket (systemd's) a `bind` entry asks for, if any: by
    name (systemd:NAME, the socket's FileDescriptorName=), by number (fd://N)
    or by address: a unix path, or a TCP address equal to the one the socket
    is bound to (a host name is resolved as bind() would; 0.0.0.0:P also
    matches a dual-stack [::]:P, which serves IPv4 too). Such an entry is
    served by that socket: binding it again would fail (EADDRINUSE) or, for
    fd://N, wrap the same fd twice. A systemd:NAME that matches nothing gives
    None (bind() then says so)."""
    from sockherd.master.addresses import AddressError

    try:
        address = parse(text)
    except AddressError:
        return None                          # bind() says what is wrong with it
    kernel = _kernel_addresses(address) if address.kind == "tcp" and address.port else set()
    for lst in activated:
        if lst.sock.fileno() == -1:
            continue
        if address.kind == "systemd":
            if lst.descriptor.name == address.name:
                return lst
        elif address.kind == "fd":
            if lst.sock.fileno() == address.fd:
                return lst
        elif lst.descriptor.type != "stream":
            continue                         # an address in `bind` is a stream listener
        elif address.kind == "unix":
            if lst.descriptor.family == "unix" and \
                    os.path.normpath(lst.descriptor.address) == os.path.normpath(address.path):
                return lst
        elif lst.descriptor.family in ("inet", "inet6") and address.port:
            if lst.descriptor.address in kernel or (
                    address.host == "0.0.0.0"
                    and lst.descriptor.address == f"[::]:{address.port}" and _dual_stack(lst)):
                return lst
    return None


def _kernel_addresses(address: Address) -> set[str]:
    """What getsockname() of a socket bound to a TCP address would say: the
    address bind() would use first, and the others it resolves to."""
    from sockherd.ipc.listeners import format_address

    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE | socket.AI_NUMERICSERV)
    except OSError:
        return set()
    return {format_address(family, sockaddr[:2]) for family, _, _, _, sockaddr in infos}


def _dual_stack(lst: Listener) -> bool:
    try:
        return not lst.sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
    except OSError:
        return False
