"""A ClientHello whose SNI is not UTF-8 (issue 35 §19), on a real engine
with openssl s_client as the client (it sends -servername's bytes as
they are; Python's ssl cannot).

Finding reproduced: the SNI was decoded as UTF-8 into SSL_TLS_SNI, the
decode failed, and its NULL went into PyDict_Update (wsgi_app.c): every
WSGI request on that connection was dropped with a SystemError, and each
connection logged an ERROR with a traceback, unthrottled: a remote log
flood. Now the name is decoded as latin-1 (PEP 3333's rule for the
environ's strings: each byte one code point; nothing fails), the request
is served, and an error of the engine's own that repeats is logged at
most a few times per kind and interval, then counted (conn_report.c):
the next line of that kind says how many were not logged."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from test_http_parser_and_wsgi_framing import wait_for
from tls_support import make_pki

pytestmark = pytest.mark.timeout(120)

CLIENT_ENV = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
NAME = b"caf\xe9-\xff\xfe.example"


def app(environ, start_response):
    body = environ.get("SSL_TLS_SNI", "-").encode("latin-1")
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def s_client(addr, pki, name: bytes) -> bytes:
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed (make test installs it)")
    r = subprocess.run([b"openssl", b"s_client", b"-connect", f"127.0.0.1:{addr[1]}".encode(),
                        b"-CAfile", str(pki.ca_file).encode(), b"-servername", name, b"-quiet"],
                       input=b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                       capture_output=True, timeout=30, env=CLIENT_ENV)
    return r.stdout


def test_a_latin1_sni_is_served_and_given_to_the_app(serve_wsgi, pki, caplog):
    _, addr = serve_wsgi(app, **pki.settings())
    out = s_client(addr, pki, NAME)
    assert out.startswith(b"HTTP/1.1 200 "), out       # before: b'' (SystemError, closed)
    assert out.endswith(b"\r\n\r\n" + NAME), out
    assert "SystemError" not in caplog.text and "failed" not in caplog.text, caplog.text


def test_many_such_connections_log_nothing(serve_wsgi, pki, caplog):
    _, addr = serve_wsgi(app, **pki.settings())
    for _ in range(10):
        assert s_client(addr, pki, NAME).startswith(b"HTTP/1.1 200 ")
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


class Boom:
    """A response whose close() raises: an error of the engine's kind
    "close() of the app's response" on every request (the app's own
    errors, kind "app", are each logged: they are the app's)."""

    def __iter__(self):
        return iter([b"ok"])

    def close(self):
        raise RuntimeError("close failed")


def closing_app(environ, start_response):
    start_response("200 OK", [("Content-Length", "2")])
    return Boom()


def test_a_repeated_error_of_one_kind_is_logged_a_few_times_then_counted(serve_wsgi, caplog):
    import http.client

    _, addr = serve_wsgi(closing_app)

    def lines():
        return [r.getMessage() for r in caplog.records
                if "close() of the app's response" in r.getMessage()]

    def get():
        c = http.client.HTTPConnection(*addr, timeout=10)
        c.request("GET", "/")
        assert c.getresponse().read() == b"ok"
        c.close()

    for _ in range(40):
        get()
    wait_for(lambda: len(lines()) >= 5, 10, "the first lines")
    time.sleep(0.3)
    assert len(lines()) == 5, lines()         # before: 40 lines
    assert "more like it are counted" in lines()[-1], lines()[-1]
    time.sleep(10.2)                          # the interval ends
    get()
    wait_for(lambda: len(lines()) == 6, 10, "the line after the interval")
    assert "35 more like it were not logged" in lines()[-1], lines()[-1]
