"""The access log line of each request, whatever the app did to its environ.

Found by the adversarial review of the connection layer after issue 18."""
from __future__ import annotations

import socket
import sys

import pytest

from test_engine_connection_lifecycle import recv_until
from test_http_parser_and_wsgi_framing import serve, wait_for  # noqa: F401

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("mangle", ["clear", "pop"])
def test_an_app_that_empties_its_environ_still_gets_its_access_line(serve, mangle, tmp_path,
                                                                    monkeypatch):
    """Review finding: AccessLog read the environ with [] after the app ran;
    an app that emptied it (or popped a key it had consumed) made the access
    line a KeyError: no line, and an unraisable traceback per request. The
    response stands and the line is written, '-' for what is gone."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(u.exc_value))

    def app(environ, start_response):
        if mangle == "clear":
            environ.clear()
        else:
            environ.pop("PATH_INFO")
            environ.pop("SERVER_PROTOCOL")
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    log = tmp_path / "access.log"
    _, addr = serve(app, access_logfile=str(log), access_log_format="%(h)s %(r)s %(s)s %(U)s")
    c = socket.create_connection(addr, timeout=10)
    try:
        c.sendall(b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")
        assert recv_until(c, lambda b: b.endswith(b"ok"), 5).endswith(b"ok")
    finally:
        c.close()
    assert wait_for(lambda: log.read_text(), 5)
    line = log.read_text().rstrip("\n")
    assert line.endswith(" 200 -"), line
    assert not unraisable, unraisable
