"""Issue 35 review, point 21's escaping of the access log: control bytes
became \\xHH ("nginx's escaping", worker/accesslog.py _safe), but nginx
escapes `"` and `\\` too (\\x22, \\x5C), and this was left out. The
default format quotes the client's own values ("%(r)s" "%(f)s" "%(a)s"),
so a User-Agent with a `"` closes its field and writes fields of its own
choosing into the line (a forged referer, status, size for whatever
parses the log by its quotes); and a literal backslash sequence in a value
reads the same as an escaped control byte (`\\x0a` typed by the client
is not told apart from a newline the log escaped).

A real worker Loop over a real fdcore Table on loopback (conftest.py's
serve_wsgi); the access log a real file, read with a deadline."""
from __future__ import annotations

import shlex
import socket
import time

import pytest

pytestmark = pytest.mark.timeout(60)

# master/settings_table.py's access_log_format default (gunicorn's)
DEFAULT = '%(h)s - - %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s" %(L)s'
UA = b'ua" 999 1 "http://forged.example/" "x\\x0a'


def app(environ, start_response):
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]


def read_lines(path, n: int) -> list[str]:
    deadline = time.monotonic() + 10             # the line follows the response
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.01)


def test_a_quote_in_a_header_cannot_add_fields_to_the_default_line(serve_wsgi, tmp_path):
    log = tmp_path / "access.log"
    _, addr = serve_wsgi(app, access_logfile=str(log), access_log_format=DEFAULT)
    with socket.create_connection(addr, timeout=10) as c:
        c.sendall(b"GET /x HTTP/1.1\r\nHost: h\r\nUser-Agent: " + UA +
                  b"\r\nConnection: close\r\n\r\n")
        while c.recv(65536):
            pass
    line = read_lines(log, 1)[0]
    # h - - [t] "r" s b "f" "a" L: ten fields as a log parser splits them
    fields = shlex.split(line.replace("[", '"').replace("]", '"'))
    assert len(fields) == 10, fields
    assert fields[8] == 'ua\\x22 999 1 \\x22http://forged.example/\\x22 \\x22x\\x5cx0a', fields
