"""Issue 35 review 3, of 10e278c (take_secrets: the worker keeps neither
the ticket secret nor the key's bytes): the whole Python heap of a serving
worker is searched, not only its config, for the private key (its PEM
text, or hex as the assignment carried it), for a 64-digit hex string (the
ticket secret as it travelled) and for the key's password, on the WSGI
and the ASGI paths. The ticket secret and the key held (10e278c); the
key's password did not, given as the setting keyfile_password (the
worker's cfg keeps every setting: worker.cfg of the hooks, loop.config) or
in the environment, SOCKHERD_KEYFILE_PASSWORD, which the settings' help
recommends over the command line and which every worker inherited (its
os.environ, the app's). keyfile_password_file held: the master reads it.
With the password and the key file (a backup, a copy in the app's tree,
a key readable by the worker's group), the key is the app's. Fixed:
take_secrets takes the setting too, and a worker's environment goes
without the variable (master/spawn.py MASTER_ONLY).
"""
from __future__ import annotations

import socket

import pytest

from test_run import master  # noqa: F401 (fixture)
from tls_support import make_pki

pytestmark = pytest.mark.timeout(120)

SCAN = """
import gc, re

def _found():
    with open(KEY, "rb") as f:
        line = f.read().split(b"\\n")[2]          # a base64 line of the key
    with open(PW, "rb") as f:
        pw = f.read().strip()
    needles = {"key_pem": line, "key_hex": line.hex().encode(), "password": pw}
    mine = {id(line), id(pw)} | {id(v) for v in needles.values()}
    hex64 = re.compile(r"[0-9a-f]{64}")
    found = set()
    # from every tracked object down through its referents: a dict holding
    # only strings and bytes is not tracked itself (gc.get_objects misses it)
    todo, seen = gc.get_objects(), set(mine)
    while todo:
        r = todo.pop()
        if id(r) in seen:
            continue
        seen.add(id(r))
        if isinstance(r, (str, bytes, bytearray)):
            if isinstance(r, str):
                if hex64.fullmatch(r):
                    found.add("ticket_secret")
                r = r.encode("latin-1", "replace")
            for name, n in needles.items():
                if n in r:
                    found.add(name)
        else:
            todo.extend(gc.get_referents(r))
    return ",".join(sorted(found)) or "none"
"""

WSGI = """
def app(environ, start_response):
    body = _found().encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
"""

ASGI = """
async def app(scope, receive, send):
    body = _found().encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
"""


@pytest.mark.parametrize("interface", ["wsgi", "asgi"])
@pytest.mark.parametrize("given", ["file", "setting", "env"])
def test_no_key_ticket_secret_nor_password_anywhere_in_a_worker(master, tmp_path, monkeypatch,
                                                               interface, given):
    pki = make_pki(tmp_path / "pki")
    pw = b"pw-Zq81-not-in-any-source"
    key = pki.encrypted_key(pw)
    (tmp_path / "pw.txt").write_bytes(pw + b"\n")
    (tmp_path / "heapapp.py").write_text(
        f"KEY = {str(key)!r}\nPW = {str(tmp_path / 'pw.txt')!r}\n" + SCAN
        + (WSGI if interface == "wsgi" else ASGI))
    how = {"file": ["--keyfile-password-file", str(tmp_path / "pw.txt")],
           "setting": ["--keyfile-password", pw.decode()], "env": []}[given]
    if given == "env":
        monkeypatch.setenv("SOCKHERD_KEYFILE_PASSWORD", pw.decode())
    m = master("heapapp:app", "--interface", interface, "--lifespan", "off", "-w", "1",
               "--certfile", str(pki.cert), "--keyfile", str(key), *how, ready=1)
    raw = socket.create_connection(("127.0.0.1", m.port), timeout=10)
    with pki.context().wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = b"".join(iter(lambda: s.recv(65536), b""))
    assert got.startswith(b"HTTP/1.1 200"), got
    assert got.split(b"\r\n\r\n", 1)[1] == b"none"
