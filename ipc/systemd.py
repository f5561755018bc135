"""systemd socket activation: the LISTEN_FDS protocol of sd_listen_fds(3).

What systemd documents, and what we therefore do (mirroring sd_listen_fds_with_names()
of libsystemd, src/libsystemd/sd-daemon/sd-daemon.c):

* Passed fds are numbered from SD_LISTEN_FDS_START (3) upwards, LISTEN_FDS of them.
* LISTEN_PID must equal getpid(): if it is unset or names another process (the variables
  leaked through a fork or an exec wrapper), the fds are not for us and the result is
  "none" (0), not an error. An unparsable LISTEN_PID or LISTEN_FDS is an error (-EINVAL),
  and so is LISTEN_FDS <= 0.
* LISTEN_FDNAMES is colon-separated, empty names kept ("a::b" is three names); its count
  must equal LISTEN_FDS (else -EINVAL). Unset: every fd is named "unknown".
* Every fd is set close-on-exec (fails with EBADF if systemd's promise is false).
* With unset_environment, the three variables are removed whatever the outcome, so no
  child process (our workers!) ever mistakes them for its own.

We are stricter than libsystemd in one way only: numbers are plain decimal digits, at
most 10 of them.

And the sending half of sd_notify(3) (`notify`): one datagram of newline-separated
KEY=VALUE lines on the AF_UNIX SOCK_DGRAM socket NOTIFY_SOCKET names, a filesystem path
or, when it starts with '@', a name in the abstract namespace. sd_notify(3) declares this
protocol stable and shows it reimplemented in a few lines without libsystemd ("Notes");
see master/notify.py for why sockherd does that rather than use a library. Unlike
sd_notify(), `notify` never unsets NOTIFY_SOCKET: the master notifies for its whole life,
across its own re-exec (the workers are spawned without it: master/spawn.py).
"""

import fcntl
import os
import re
import socket
from typing import NamedTuple

from .errors import ActivationError
from .fds import borrowed_socket, close_all
from .listeners import ListenerDescriptor, describe

SD_LISTEN_FDS_START = 3
_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
# At most 10 digits: more is no pid nor fd count, and int() refuses 4300 digits or more.
_DECIMAL = re.compile(r"[0-9]{1,10}")


class ActivatedFd(NamedTuple):
    fd: int
    name: str


NOTIFY_VARIABLE = "NOTIFY_SOCKET"
# sockaddr_un.sun_path: 108 bytes; a path needs its NUL, an abstract name does not
_SUN_PATH = 108


def notify_address(value: str) -> str | bytes:
    """The socket address NOTIFY_SOCKET's value names: an absolute path, or '@name' for
    the abstract namespace (a leading NUL byte, no terminating one). Raises ValueError
    for anything else (systemd itself passes nothing else but vsock:, which we do not
    speak)."""
    raw = os.fsencode(value)
    if raw.startswith(b"@") and len(raw) > 1:
        if len(raw) > _SUN_PATH:
            raise ValueError(f"{NOTIFY_VARIABLE}={value!r}: abstract name longer than "
                             f"{_SUN_PATH - 1} bytes")
        return b"\0" + raw[1:]
    if raw.startswith(b"/"):
        if b"\0" in raw or len(raw) >= _SUN_PATH:
            raise ValueError(f"{NOTIFY_VARIABLE}={value!r}: not a usable socket path")
        return value
    raise ValueError(f"{NOTIFY_VARIABLE}={value!r}: neither an absolute path nor an '@' "
                     "abstract name")


def notify(message: str, address: str | None = None, *, timeout: float = 1.0) -> bool:
    """Sends `message` (KEY=VALUE lines) to systemd as one datagram, to `address` or else
    to $NOTIFY_SOCKET. False if there is none (not run by systemd: nothing to do), True
    once sent. Raises ValueError for an unusable address and OSError when sending fails
    (no socket there, refused, or still no room in systemd's queue after `timeout`
    seconds: a full queue never blocks the caller longer)."""
    value = os.environ.get(NOTIFY_VARIABLE) if address is None else address
    if not value:
        return False
    target = notify_address(value)
    data = message.encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        # connected, so that poll() waits for room in the receiver's queue
        sock.connect(target)
        sock.settimeout(timeout)
        sent = sock.send(data)
    if sent != len(data):                       # a datagram goes whole or not at all
        raise OSError(f"short notify datagram ({sent} of {len(data)} bytes)")
    return True


def listen_fds(unset_environment: bool = True, environ=None) -> list[ActivatedFd]:
    """The fds systemd passed to this process, with their names ([] if none are for us).
    Raises ActivationError where sd_listen_fds_with_names() returns a negative errno."""
    env = os.environ if environ is None else environ
    try:
        return _parse(env)
    finally:
        if unset_environment:
            for name in _VARIABLES:
                env.pop(name, None)


def _parse(env) -> list[ActivatedFd]:
    pid_text = env.get("LISTEN_PID")
    if pid_text is None:
        return []
    pid = _number("LISTEN_PID", pid_text)
    if pid <= 0:
        raise ActivationError(f"LISTEN_PID={pid_text!r} is not a valid pid")
    if pid != os.getpid():
        return []     # meant for another process: documented as "no fds", not an error
    count_text = env.get("LISTEN_FDS")
    if count_text is None:
        return []
    count = _number("LISTEN_FDS", count_text)
    if count <= 0:
        raise ActivationError(f"LISTEN_FDS={count_text!r} must be at least 1")
    names_text = env.get("LISTEN_FDNAMES")
    if names_text is None:
        names = ["unknown"] * count
    else:
        names = names_text.split(":") if names_text else []
        if len(names) != count:
            raise ActivationError(f"LISTEN_FDNAMES has {len(names)} names for "
                                  f"LISTEN_FDS={count} fds: {names_text!r}")
    fds = range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count)
    for fd in fds:
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFD)
            fcntl.fcntl(fd, fcntl.F_SETFD, flags | fcntl.FD_CLOEXEC)
        except OSError as exc:
            raise ActivationError(f"LISTEN_FDS={count} but fd {fd} is unusable "
                                  f"({exc.strerror})") from None
    return [ActivatedFd(fd, name) for fd, name in zip(fds, names)]


def _number(variable: str, text: str) -> int:
    if not _DECIMAL.fullmatch(text):
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise ActivationError(f"{variable}={shown!r} is not a decimal number of at most "
                              "10 digits")
    return int(text)


def adopt(activated: list[ActivatedFd]) -> list[tuple[ListenerDescriptor, socket.socket]]:
    """Wrap activated fds as sockets with their descriptors (named as systemd named
    them). Every fd must be a listening socket of a family we know; otherwise all of them
    are closed and ActivationError says which one was wrong."""
    described = []
    try:
        for item in activated:
            described.append(_describe(item))
    except BaseException:
        close_all(item.fd for item in activated)
        raise
    return [(desc, socket.socket(fileno=item.fd)) for desc, item in zip(described, activated)]


def _describe(item: ActivatedFd) -> ListenerDescriptor:
    where = f"activated fd {item.fd} ({item.name!r})"
    try:
        with borrowed_socket(item.fd) as sock:
            if sock.type != socket.SOCK_DGRAM and not sock.getsockopt(
                    socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                raise ActivationError(f"{where} is not listening")
            return describe(sock, item.name)
    except OSError as exc:
        raise ActivationError(f"{where} is not a socket ({exc.strerror})") from None
    except KeyError:
        raise ActivationError(f"{where} is a socket of an unsupported family or type") from None
