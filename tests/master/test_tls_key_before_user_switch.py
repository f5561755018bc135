"""The TLS key is read before the workers drop privileges (issue 35 §26),
on a real master run as root with `--user nobody`.

Finding reproduced: each worker switched to `--user` (worker/identity.py)
and then opened the certificate and key itself, so a key readable by root
alone (mode 0600, as in /etc/ssl/private) failed every worker with only
OpenSSL's "system lib": no file named, no reason. Now the master, which
keeps its identity, reads the certificate, key, client CAs and password
file when it spawns a worker and sends their bytes in the assignment
(master/tls.py; the engine loads them from memory, conn_tls_load.c), as
nginx reads its keys before it drops privileges; an error still names the
file and the errno's text."""
from __future__ import annotations

import os
import pwd
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from test_run import _status, children, master  # noqa: F401 (fixture)
from tls_support import make_pki, read_response

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")]

APP = """
def app(environ, start_response):
    body = ("%s %s" % (environ["wsgi.url_scheme"], environ.get("SSL_CLIENT_VERIFY"))).encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
"""


@pytest.fixture
def shared():
    """An app directory nobody may enter (pytest's own tmp tree is root-only)."""
    d = Path(tempfile.mkdtemp(prefix="sockherd-tlsuser-"))
    d.chmod(0o755)
    (d / "userapp.py").write_text(APP)
    yield d
    shutil.rmtree(d)


def root_only(*paths: Path) -> None:
    for p in paths:
        os.chown(p, 0, 0)
        p.chmod(0o600)


def get(port: int, ctx) -> bytes:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return read_response(s)[1]


def as_nobody(m) -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    kids = children(m.proc.pid)
    assert kids and all(_status(p)["Uid"].split() == [str(nobody)] * 4 for p in kids)


def test_a_root_only_key_and_ca_file_serve_with_user_nobody(master, tmp_path, shared):
    pki = make_pki(tmp_path / "pki")
    root_only(pki.key, pki.ca_file, pki.cert)
    m = master("userapp:app", "-w", "2", "--user", "nobody", "--certfile", str(pki.cert),
               "--keyfile", str(pki.key), "--ca-certs", str(pki.ca_file),
               "--cert-reqs", "optional", chdir=shared)
    as_nobody(m)
    assert get(m.port, pki.context(client_cert=True)) == b"https SUCCESS"
    assert get(m.port, pki.context()) == b"https NONE"


def test_an_encrypted_root_only_key_with_a_root_only_password_file(master, tmp_path, shared):
    pki = make_pki(tmp_path / "pki")
    key = pki.encrypted_key(b"s3cret")
    pw = tmp_path / "pw"
    pw.write_bytes(b"s3cret\n")
    root_only(key, pw)
    m = master("userapp:app", "-w", "1", "--user", "nobody", "--certfile", str(pki.cert),
               "--keyfile", str(key), "--keyfile-password-file", str(pw), chdir=shared,
               ready=1)
    as_nobody(m)
    assert get(m.port, pki.context()) == b"https NONE"
