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


def write(path: str) -> None:
    """Raises OSError (the caller refuses to start, as for a bind)."""
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
