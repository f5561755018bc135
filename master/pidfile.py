"""The `pidfile` setting (gunicorn's -p/--pid): the master's pid, written
once it has bound its listeners and removed as it exits.

Written to a temporary file renamed into place, so a reader never sees a
half-written pid. Removed only if it still holds our pid: a takeover's new
instance (`run --takeover`) writes its own before this one exits, and an
upgrade re-executes in place (same pid: the new image writes it again).
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger("sockherd.master")


def holder(path: str) -> int:
    """The pid in path if it is a running sockherd other than us, else 0
    (no file, a stale pid, or a pid now some other program's)."""
    try:
        with open(path) as f:
            pid = int(f.read().strip() or 0)
        if pid <= 0 or pid == os.getpid():
            return 0
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return pid if b"sockherd" in f.read() else 0
    except (OSError, ValueError):
        return 0


def write(path: str, replacing: int = 0) -> None:
    """Raises OSError (the caller refuses to start, as for a bind),
    among others when path holds the pid of another running sockherd
    than `replacing` (a takeover's predecessor): a second instance took
    the first one's pidfile, and removed it at its exit (issue 36 §6)."""
    held = holder(path)
    if held and held != replacing:
        raise OSError(f"pidfile {path} holds pid {held}, a running sockherd: give this one "
                      f"its own (-p FILE), or stop that one")
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remove(path: str) -> None:
    try:
        with open(path) as f:
            mine = f.read().strip() == str(os.getpid())
        if mine:
            os.unlink(path)
    except OSError as exc:
        log.warning("pidfile %s: not removed: %s", path, exc.strerror)
