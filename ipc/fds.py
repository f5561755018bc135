"""Ownership of received and queued fds.

Whoever holds an fd number in sockherd.ipc owns it and must close it on every path,
including the error ones; these are the moves needed for that.
"""

import fcntl
import os
import socket
from contextlib import contextmanager


def close_all(fds) -> None:
    """Close fds we own. Never raises: it runs on error paths, where a second exception
    would hide the first and leave the remaining fds open."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def dup_all(fds) -> list[int]:
    """Close-on-exec duplicates of fds, so a queued message keeps its fds alive even if the
    caller closes its own copies before the queue drains. All or nothing."""
    dups: list[int] = []
    try:
        for fd in fds:
            dups.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 0))
    except BaseException:
        close_all(dups)
        raise
    return dups


@contextmanager
def borrowed_socket(fd: int):
    """A socket object over an fd someone else owns, for probing it (family, type,
    getsockname...). socket(fileno=) asks the kernel for family and type and raises OSError
    if fd is no open socket; detach() on exit so this object never closes the fd."""
    sock = socket.socket(fileno=fd)
    try:
        yield sock
    finally:
        sock.detach()
