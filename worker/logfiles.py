"""Log files: where the master's and the workers' lines go, in which
format, and their reopening on USR1 (logrotate's postrotate).

Two streams, as gunicorn has them:

  - the error log (`error_logfile`): every logger's lines, master and
    workers. A path is opened O_APPEND and put on fd 2 (dup2), so that
    what is written to stderr outside logging (a traceback Python prints
    on its own, faulthandler's dump) lands in the same file; the workers
    inherit that fd 2 from the master;
  - the access log (`access_logfile`, worker/accesslog.py): one line per
    request, exactly the format, written by the loop threads straight to
    the file's fd with one write(2) per line: no logging record, no
    handler lock. O_APPEND makes each write land whole at the end of the
    file, whichever thread or worker writes it.

Reopening without a lost or split line: a LogFile keeps its fd number for
its whole life; reopen() opens the path anew (logrotate renamed the old
file away) and dup2()s the new file onto that number. dup2 replaces the
descriptor atomically, so a write in flight on another thread goes whole
to the old file or whole to the new one, and the writers never take a
lock for it. The master reopens first (creating the files, and handing
them to the workers' user when `user` is set: a worker that switched user
could not create them in a root-owned directory), then sends USR1 to each
worker, which reopens its own descriptors the same way.
"""
from __future__ import annotations

import json
import logging
import logging.config
import os
import sys
import time
import tomllib

STDERR = "-"
FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


class LogFileError(ValueError):
    """A log file that cannot be opened (the path and why): exit 2 at a
    start."""


def open_append(path: str, setting: str) -> int:
    try:
        return os.open(path, FLAGS, 0o644)
    except OSError as exc:
        raise LogFileError(f"{setting} = {path!r}: cannot open it: {exc.strerror}") from None


class LogFile:
    """An append-only log by path ('-': stderr) whose fd number stays the
    same across reopen(). fd: an fd to take over as the file's (the
    error log's 2), else a new one."""

    def __init__(self, path: str, setting: str, fd: int | None = None) -> None:
        self.path, self.setting = path, setting
        if path == STDERR:
            self.fd = 2
            return
        new = open_append(path, setting)
        if fd is None:
            self.fd = new
        else:
            os.dup2(new, fd, inheritable=fd <= 2)
            os.close(new)
            self.fd = fd

    @classmethod
    def adopt(cls, path: str, setting: str, fd: int) -> "LogFile":
        """fd is path's already (inherited): kept as it is, for reopen()."""
        lf = cls.__new__(cls)
        lf.path, lf.setting, lf.fd = path, setting, fd
        return lf

    def write(self, data: bytes) -> None:
        """One line (or several), from any thread, no lock: one write(2)
        for a line below the pipe size (a regular file takes it whole)."""
        while data:
            try:
                n = os.write(self.fd, data)
            except InterruptedError:
                continue
            except OSError:
                return                  # a full disk loses the line, never the request
            data = data[n:]

    def reopen(self, owner: tuple[int, int] | None = None) -> None:
        """The path anew on the same fd number (USR1). owner: (uid, gid)
        the file is handed to (the master's part, for workers that switched
        user). An error is logged and the old file stays in use."""
        if self.path == STDERR:
            return
        try:
            new = open_append(self.path, self.setting)
        except LogFileError as exc:
            logging.getLogger("sockherd").error("reopen: %s; writing on to the old file", exc)
            return
        try:
            if owner is not None:
                os.fchown(new, *owner)
            os.dup2(new, self.fd, inheritable=self.fd <= 2)
        finally:
            os.close(new)


# this process's log files, reopened by reopen_all() (USR1)
OPENED: list[LogFile] = []


def open_log(path: str, setting: str, fd: int | None = None) -> LogFile:
    """A LogFile, kept for reopen_all()."""
    lf = LogFile(path, setting, fd)
    OPENED.append(lf)
    return lf


def reopen_all(owner: tuple[int, int] | None = None) -> None:
    for lf in OPENED:
        lf.reopen(owner)


class JsonFormatter(logging.Formatter):
    """`log_format = json` for the error log: one object per line, stable
    keys (time, level, logger, process, pid, message; exception when there
    is one)."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": iso_time(record.created), "level": record.levelname,
               "logger": record.name, "process": self.process, "pid": record.process,
               "message": record.getMessage()}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        return json.dumps(doc, ensure_ascii=False)


def iso_time(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1e6):06d}" \
        + time.strftime("%z", time.localtime(t))


def configure(process: str, level: str, log_format: str = "text",
              log_config: str | dict = "") -> None:
    """The root logger for this process ('master' or 'worker PID'):
    stderr (fd 2: the error log), text or JSON; then log_config's
    dictConfig on top when set: a file's path, or the table itself.
    Raises LogFileError for a bad file or table."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(process.split()[0]))
    else:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s [{process}] %(levelname)s %(message)s"))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    if log_config:
        table = isinstance(log_config, dict)
        doc = with_defaults(dict(log_config)) if table else read_dict_config(log_config)
        try:
            logging.config.dictConfig(doc)
        except (ValueError, TypeError, AttributeError, ImportError) as exc:
            said = "log_config (a table)" if table else f"log_config = {log_config!r}"
            raise LogFileError(f"{said}: {exc}") from None


def read_dict_config(path: str) -> dict:
    """A logging.config.dictConfig dict from a TOML or JSON file (by its
    suffix; .toml, else JSON)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise LogFileError(f"log_config = {path!r}: cannot read it: {exc.strerror}") from None
    try:
        doc = tomllib.loads(raw.decode()) if path.endswith(".toml") else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise LogFileError(f"log_config = {path!r}: not valid "
                           f"{'TOML' if path.endswith('.toml') else 'JSON'}: {exc}") from None
    if not isinstance(doc, dict):
        raise LogFileError(f"log_config = {path!r}: a table of dictConfig keys expected")
    return with_defaults(doc)


def with_defaults(doc: dict) -> dict:
    """dictConfig's two keys a config most often leaves out, as gunicorn
    fills them: version 1, and the loggers configured before kept."""
    doc.setdefault("version", 1)
    doc.setdefault("disable_existing_loggers", False)
    return doc
