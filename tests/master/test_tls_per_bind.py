"""TLS per bind (issue 24 §2: "TLS on every bind, or per bind where an
operator needs a plain one beside it"), on real masters and workers.

Finding reproduced: with certfile set, every bind served TLS; an operator
could not keep a plain port (a health check, a proxy in front speaking
plain HTTP over a unix socket) beside the HTTPS one. Now a `bind` entry
marked tls:// serves TLS and, once any entry is marked, the others are
plain (master/tls_binds.py); each connection's scheme is its listener's
(WSGI wsgi.url_scheme/HTTPS, the ASGI scope's scheme); a reload that
changes a bind's TLS-ness keeps its socket and serves it the new way from
the new generation on."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile

import pytest

from test_reload import free_port
from test_run import listener_inode, master, wait_for  # noqa: F401 (fixture)
from tls_support import make_pki, read_response

pytestmark = pytest.mark.timeout(120)

WSGI = """
def app(environ, start_response):
    body = ("%s %s" % (environ["wsgi.url_scheme"], environ.get("HTTPS", "-"))).encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
"""

ASGI = """
import json

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = json.dumps({"scheme": scope["scheme"],
                       "tls": "tls" in scope.get("extensions", {})}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
"""


@pytest.fixture
def pki(tmp_path):
    (tmp_path / "bindapp.py").write_text(WSGI)
    (tmp_path / "bindasgi.py").write_text(ASGI)
    return make_pki(tmp_path / "pki")


@pytest.fixture
def sockdir():
    """A short directory for unix sockets (sun_path: 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="shtls") as d:
        yield d


def tls_args(pki) -> list[str]:
    return ["--certfile", str(pki.cert), "--keyfile", str(pki.key)]


def get(sock: socket.socket, ctx=None, host: str = "127.0.0.1") -> bytes:
    """The body of GET / over sock (wrapped in TLS with ctx)."""
    s = ctx.wrap_socket(sock, server_hostname="127.0.0.1") if ctx else sock
    with s:
        s.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        return read_response(s)[1]


def tcp(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def unix(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    return s


def test_https_on_the_tls_bind_and_http_on_the_plain_unix_one(master, pki, sockdir):
    """WSGI: one server, a TLS TCP port and a plain unix socket beside it;
    each connection is told its own scheme; plain HTTP to the TLS port
    still gets nginx's 400."""
    port, path = free_port(), os.path.join(sockdir, "plain.sock")
    m = master("bindapp:app", "-w", "2", *tls_args(pki), "-b", f"tls://127.0.0.1:{port}",
               "-b", f"unix:{path}", bind=None)
    ctx = pki.context()
    for _ in range(4):                     # both workers, both listeners
        assert get(tcp(port), ctx) == b"https on"
        assert get(unix(path)) == b"http -"
    with tcp(port) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 400 Bad Request"), m.text()


def test_asgi_scheme_per_connection_with_tls_on_a_unix_socket(master, pki, sockdir):
    """ASGI, the other way round: TLS on a unix socket (allowed: the
    engine does not care what carries the session), a plain TCP port
    beside it; the scope's scheme and the tls extension follow the
    connection, not the server."""
    port, path = free_port(), os.path.join(sockdir, "tls.sock")
    m = master("bindasgi:app", "-w", "1", *tls_args(pki), "-b", f"tls://unix:{path}",
               "-b", f"127.0.0.1:{port}", bind=None, ready=1)
    ctx = pki.context()
    assert json.loads(get(unix(path), ctx)) == {"scheme": "https", "tls": True}, m.text()
    assert json.loads(get(tcp(port))) == {"scheme": "http", "tls": False}
    assert json.loads(get(unix(path), ctx)) == {"scheme": "https", "tls": True}


def run_once(tmp_path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sockherd.master", "run", *args,
                           "--chdir", str(tmp_path), "--runtime-dir", str(tmp_path / "rt")],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)


@pytest.mark.parametrize("args, message", [
    (["-b", "tls://127.0.0.1:0"],
     "bind tls://127.0.0.1:0: tls:// needs certfile"),
    (["-b", "tcp://127.0.0.1:0", "CERT"],
     "certfile is set but every bind is marked plain"),
    (["-b", "tls://127.0.0.1:0", "-b", "127.0.0.1:0", "CERT"],
     "bind 127.0.0.1:0 and bind tls://127.0.0.1:0: one address, both TLS and plain"),
    (["-b", "tls://systemd:web", "CERT"],
     "bind tls://systemd:web: TLS per bind is for addresses sockherd binds"),
    (["-b", "tls://127.0.0.1:0", "-b", "127.0.0.2:0", "--interface", "stream", "CERT"],
     "TLS is served for the HTTP interfaces"),
])
def test_a_marking_that_cannot_be_served_stops_the_start_with_exit_2(tmp_path, pki, args,
                                                                      message):
    args = [a for arg in args for a in (tls_args(pki) if arg == "CERT" else [arg])]
    r = run_once(tmp_path, "bindapp:app", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr, r.stderr


def test_a_stream_app_on_binds_marked_plain_serves(master, tmp_path):
    """The rule kept per bind: a stream app with no bind marked tls:// and
    no certfile serves as before (marks alone change nothing)."""
    port = free_port()
    master("echoapp:Echo", "--interface", "stream", "-b", f"tcp://127.0.0.1:{port}",
           bind=None, ready=1)
    with tcp(port) as s:
        s.sendall(b"ping")
        assert s.recv(16) == b"ping"


def scheme_of(port: int, pki) -> str:
    """What the port serves now: "https" (a TLS handshake and its answer)
    or "http" (a plain request's)."""
    try:
        return get(tcp(port), pki.context()).split()[0].decode()
    except (OSError, AssertionError):
        return get(tcp(port)).split()[0].decode()


def test_a_reload_that_swaps_tls_and_plain_keeps_both_sockets(master, tmp_path, pki):
    """Defined: the socket stays (no gap, the same accept queue); the new
    generation serves it the new way, the old one drained with its own."""
    a, b = free_port(), free_port()
    config = tmp_path / "sockherd.toml"
    cert = f'certfile = "{pki.cert}"\nkeyfile = "{pki.key}"\n'
    config.write_text(cert + f'bind = ["tls://127.0.0.1:{a}", "127.0.0.1:{b}"]\n')
    m = master("bindapp:app", "-w", "1", "-c", str(config), bind=None, ready=1)
    inodes = listener_inode(a), listener_inode(b)
    assert (scheme_of(a, pki), scheme_of(b, pki)) == ("https", "http")
    config.write_text(cert + f'bind = ["127.0.0.1:{a}", "tls://127.0.0.1:{b}"]\n')
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: generation 2 serving")
    wait_for(lambda: (scheme_of(a, pki), scheme_of(b, pki)) == ("http", "https"), 20,
             lambda: f"the swapped schemes\n{m.text()}")
    assert (listener_inode(a), listener_inode(b)) == inodes
    assert "new in generation 2" not in m.text()
