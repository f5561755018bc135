"""The access log: one line per request, exactly the format.

gunicorn's atoms with gunicorn's meanings (a format from a gunicorn.conf.py
prints the same here):

    h remote address          l '-'                     u remote user (Basic auth) or '-'
    t [time] (with brackets)  r request line            m method
    U path                    q query string            H protocol
    s status                  B body bytes sent         b body bytes sent, '-' for 0
    f Referer                 a User-Agent              T seconds (whole)
    M milliseconds            D microseconds            L seconds (decimal)
    p <pid>                   {name}i request header    {name}o response header
    {key}e environ key (the WSGI environ; for ASGI its equivalent keys)

An unknown atom prints '-', as gunicorn. `log_format = json` writes one
JSON object per line with stable keys instead (JSON_KEYS), whatever
access_log_format says.

The line is written by the loop thread that served the request, straight
to the access file's descriptor (worker/logfiles.py LogFile: one write(2),
no logging record, no lock); USR1 reopens that descriptor underneath.
"""
from __future__ import annotations

import base64
import binascii
import json
import os
import re
import time

from sockherd.worker.logfiles import STDERR, LogFile, open_log

JSON_KEYS = ("time", "remote_addr", "remote_user", "request", "method", "path", "query",
             "protocol", "status", "bytes", "referer", "user_agent", "duration_us", "pid")


def access_log(cfg: dict) -> "AccessLog | None":
    """The worker's access log for its settings, None when off: on with
    access_log, or when access_logfile names where (stderr by default)."""
    path = str(cfg.get("access_logfile", ""))
    if not cfg.get("access_log") and not path:
        return None
    return AccessLog(str(cfg.get("access_log_format", "")),
                     open_log(path or STDERR, "access_logfile"),
                     cfg.get("log_format") == "json")


class AccessLog:
    """Called by the engine at each response's end: (environ, status line
    or None, body bytes sent, monotonic start[, response headers]).

    The format is compiled once: only the atoms it names are computed per
    line, each by one small function, and the time strings are made once a
    second (strftime was a tenth of a line's cost)."""

    def __init__(self, fmt: str, out: LogFile, json_lines: bool = False) -> None:
        self.fmt, self.out, self.json = fmt, out, json_lines
        self.bad_format_said = False
        self.atoms = [(key, _getter(key)) for key in dict.fromkeys(ATOM.findall(fmt))]
        # the response headers are kept by the engine only when asked
        self.wants_response_headers = "}o)" in fmt and not json_lines

    def __call__(self, env: dict, status: str | None, sent: int, started: float,
                 headers=None) -> None:
        took = time.monotonic() - started
        if self.json:
            line = json.dumps(_document(env, status, sent, took), ensure_ascii=False)
        else:
            req = (env, status, sent, took, headers)
            try:
                line = self.fmt % {key: _safe(get(req)) for key, get in self.atoms}
            except (KeyError, TypeError, ValueError) as exc:
                if not self.bad_format_said:
                    self.bad_format_said = True
                    import logging
                    logging.getLogger("sockherd.access").error(
                        "access_log_format %r: %s", self.fmt, exc)
                return
        self.out.write(line.encode("utf-8", "backslashreplace") + b"\n")


ATOM = re.compile(r"%\(([^)]*)\)")
# what must not reach a log line raw: C0 controls (CR/LF would forge a
# line), DEL, C1 controls (a latin-1 header byte 0x9b is a terminal's CSI),
# and, as nginx escapes them, '"' (it would close a quoted field of the
# format, "%(a)s", and write fields of the client's choosing) and '\'
# (a client's literal "\x0a" would read as an escaped newline)
_CONTROL = re.compile(r'[\x00-\x1f\x7f-\x9f"\\]')


def _escape(m: re.Match) -> str:
    return "\\x%02x" % ord(m.group())


def _safe(value):
    """An atom's value with its control characters, '"' and '\\' as \\xHH
    (nginx's escaping): a value is the client's (a header, the path, a PROXY
    header's path) or the app's (an environ key, a response header), and
    neither may split or forge a line. The format's own text is kept."""
    if isinstance(value, (int, float)):
        return value                             # %(B)d and the like stay numbers
    if not isinstance(value, str):
        value = str(value)                       # what %s would print: escaped too
    return _CONTROL.sub(_escape, value) if _CONTROL.search(value) else value


class _Clock:
    """The time strings of the current second, made once a second."""

    second = -1
    clf = iso = ""

    @classmethod
    def now(cls) -> tuple[float, str, str]:
        t = time.time()
        sec = int(t)
        if sec != cls.second:
            lt = time.localtime(sec)
            cls.clf = time.strftime("[%d/%b/%Y:%H:%M:%S %z]", lt)
            cls.iso = time.strftime("%Y-%m-%dT%H:%M:%S.{:06d}%z", lt)
            cls.second = sec
        return t, cls.clf, cls.iso


def _document(env: dict, status: str | None, sent: int, took: float) -> dict:
    get = env.get
    method, proto = get("REQUEST_METHOD", "-"), get("SERVER_PROTOCOL", "-")
    code = int(status[:3]) if status and status[:3].isdigit() else None
    t, _, iso = _Clock.now()
    return {"time": iso.format(int(t % 1 * 1e6)), "remote_addr": get("REMOTE_ADDR") or None,
            "remote_user": _user(env), "request": f'{method} {get("RAW_URI", "-")} {proto}',
            "method": method, "path": get("PATH_INFO", ""), "query": get("QUERY_STRING", ""),
            "protocol": proto, "status": code, "bytes": sent,
            "referer": get("HTTP_REFERER"), "user_agent": get("HTTP_USER_AGENT"),
            "duration_us": int(took * 1e6), "pid": os.getpid()}


def _user(env: dict) -> str | None:
    auth = env.get("HTTP_AUTHORIZATION", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() != "basic" or not value:
        return None
    try:
        return base64.b64decode(value.strip(), validate=True).decode("utf-8").split(":", 1)[0]
    except (binascii.Error, UnicodeDecodeError):
        return None


def _env(name: str, default: str = "-"):
    return lambda r: r[0].get(name, default)


# one request: (environ, status line, bytes sent, seconds, response headers)
GETTERS = {
    "h": lambda r: r[0].get("REMOTE_ADDR") or "-",
    "l": lambda r: "-",
    "u": lambda r: _user(r[0]) or "-",
    "t": lambda r: _Clock.now()[1],
    "r": lambda r: f'{r[0].get("REQUEST_METHOD", "-")} {r[0].get("RAW_URI", "-")} '
                   f'{r[0].get("SERVER_PROTOCOL", "-")}',
    "m": _env("REQUEST_METHOD"),
    "U": _env("PATH_INFO"),
    "q": _env("QUERY_STRING"),
    "H": _env("SERVER_PROTOCOL"),
    "s": lambda r: (r[1] or "-")[:3],
    "B": lambda r: r[2],
    "b": lambda r: r[2] or "-",
    "f": _env("HTTP_REFERER"),
    "a": _env("HTTP_USER_AGENT"),
    "T": lambda r: int(r[3]),
    "M": lambda r: int(r[3] * 1e3),
    "D": lambda r: int(r[3] * 1e6),
    "L": lambda r: f"{r[3]:.6f}",
    "p": lambda r: f"<{os.getpid()}>",
}


def _getter(key: str):
    if key in GETTERS:
        return GETTERS[key]
    if len(key) > 3 and key[0] == "{" and key[-2] == "}":
        name, kind = key[1:-2], key[-1]
        if kind == "i":
            return _env("HTTP_" + name.upper().replace("-", "_"))
        if kind == "e":
            return _env(name)
        if kind == "o":
            return lambda r: _response_header(r[4], name)
    return lambda r: "-"                        # unknown atoms print as '-', as gunicorn


def _response_header(headers, name: str) -> str:
    if not headers:
        return "-"
    want = name.lower()
    for pair in headers:
        try:
            k, v = pair
        except (TypeError, ValueError):
            continue
        if isinstance(k, bytes):
            k, v = k.decode("latin-1"), v.decode("latin-1") if isinstance(v, bytes) else v
        if isinstance(k, str) and k.lower() == want:
            return str(v)
    return "-"
