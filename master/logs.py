"""The master's side of the log files (worker/logfiles.py): opened at
start, before anything binds (a file that cannot be opened is exit 2 with
its path and why), and handed to the workers' user."""
from __future__ import annotations

import os

from sockherd.worker import logfiles
from sockherd.worker.identity import IdentityError, resolve


def setup(settings) -> None:
    """The master's logging for settings; raises logfiles.LogFileError.
    The error log goes on fd 2 (the workers inherit it); the access log
    is opened (created) here too, never written by the master: so a
    worker that switches user finds it, and USR1 makes the new one."""
    owner = log_owner(settings)
    if settings.error_logfile != logfiles.STDERR:
        logfiles.open_log(settings.error_logfile, "error_logfile", fd=2)
    if settings.access_logfile not in ("", logfiles.STDERR):
        logfiles.open_log(settings.access_logfile, "access_logfile")
    if owner is not None:
        for lf in logfiles.OPENED:
            os.fchown(lf.fd, *owner)
    logfiles.configure(f"master {os.getpid()}", settings.log_level, settings.log_format,
                       settings.log_config)


def log_owner(settings) -> tuple[int, int] | None:
    """(uid, gid) the workers run as when they switch user (root master),
    else None: the files stay the master's."""
    if os.geteuid() != 0:
        return None
    try:
        ident = resolve(settings.user, settings.group)
    except IdentityError:
        return None                         # said where the workers switch
    return (ident.uid, ident.gid) if ident is not None else None
