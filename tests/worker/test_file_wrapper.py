"""wsgi.file_wrapper: what reaches the client for each kind of file.

Found by the adversarial review of the connection layer after issue 18."""
from __future__ import annotations

import socket

import pytest

from test_engine_connection_lifecycle import recv_until
from test_http_parser_and_wsgi_framing import serve  # noqa: F401

pytestmark = pytest.mark.timeout(60)


def test_a_file_that_says_size_0_and_holds_content_is_sent_whole(serve):
    """Review finding: a procfs (or sysfs) file is regular with st_size 0;
    sendfile_response sized the body by st_size, so the app's file went out
    as `Content-Length: 0`, its content lost. Such a file is read and sent
    as any file-like object is."""
    with open("/proc/self/status", "rb") as f:
        assert f.read(5) == b"Name:"

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return environ["wsgi.file_wrapper"](open("/proc/self/status", "rb"))

    _, addr = serve(app)
    c = socket.create_connection(addr, timeout=10)
    try:
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        out = recv_until(c, lambda b: False, 5.0)              # to the server's close
    finally:
        c.close()
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK"), out
    assert b"Name:" in body and b"\nPid:" in body, out[:300]          # chunked or not
