"""Ownership of received and queued fds.

Whoever holds an fd number in sockherd.ipc owns it and must close it on every path,
including the error ones; these are the only two moves needed for that.
"""

import fcntl
import os


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
