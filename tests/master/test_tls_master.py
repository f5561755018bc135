"""TLS with a real master and workers (issue 24 §2): the master loads the
certificate and key with Python's ssl at start and at every reload
(master/tls.py), so a missing or mismatched file stops the first start
with exit 2 naming the file and refuses a reload (the serving generation
keeps serving); each worker builds its own context (conn_tls_ctx.c), so a
reload reads the files again: rotating a certificate is a HUP with no
failed request, and the new certificate is what new connections get."""
from __future__ import annotations

import http.client
import shutil
import signal
import socket
import ssl
import subprocess
import sys

import pytest

from load_clients import LoopClients, under_load
from test_run import children, master, wait_for  # noqa: F401 (fixture)
from tls_support import make_pki, read_response, tls_connect

pytestmark = pytest.mark.timeout(180)

APP = """
def app(environ, start_response):
    body = environ["wsgi.url_scheme"].encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
"""


@pytest.fixture
def site(tmp_path):
    """The app, and a certificate in the files the master is given
    (live.crt, live.key), which a test may replace."""
    (tmp_path / "tlsapp.py").write_text(APP)
    pki = make_pki(tmp_path / "pki", "first")
    shutil.copy(pki.cert, tmp_path / "live.crt")
    shutil.copy(pki.key, tmp_path / "live.key")
    return pki


def tls_args(tmp_path) -> list[str]:
    return ["--certfile", str(tmp_path / "live.crt"), "--keyfile", str(tmp_path / "live.key")]


def served_cn(port: int, pki) -> str:
    with tls_connect(("127.0.0.1", port), pki.context()) as s:
        subject = dict(x[0] for x in s.getpeercert()["subject"])
        return subject["commonName"]


def run_once(tmp_path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sockherd.master", "run", "tlsapp:app",
                           "--chdir", str(tmp_path), "-b", "127.0.0.1:0",
                           "--runtime-dir", str(tmp_path / "rt"), *args],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_serves_https(master, tmp_path, site):
    m = master("tlsapp:app", "-w", "2", *tls_args(tmp_path))
    c = http.client.HTTPSConnection("127.0.0.1", m.port, timeout=10, context=site.context())
    for _ in range(20):
        c.request("GET", "/")
        assert c.getresponse().read() == b"https"
    c.close()
    assert served_cn(m.port, site) == "first"


def test_a_missing_certfile_stops_the_first_start_with_exit_2(tmp_path, site):
    r = run_once(tmp_path, "--certfile", str(tmp_path / "nope.crt"))
    assert r.returncode == 2, r.stderr
    assert f"certfile {tmp_path / 'nope.crt'}: No such file or directory" in r.stderr


def test_a_mismatched_key_stops_the_first_start_with_exit_2(tmp_path, site):
    other = make_pki(tmp_path / "other", "other")
    r = run_once(tmp_path, "--certfile", str(tmp_path / "live.crt"), "--keyfile", str(other.key))
    assert r.returncode == 2, r.stderr
    assert f"keyfile {other.key} does not match certfile {tmp_path / 'live.crt'}" in r.stderr


def test_a_wrong_key_password_stops_the_first_start(tmp_path, site):
    key = site.encrypted_key(b"right")
    r = run_once(tmp_path, "--certfile", str(site.cert), "--keyfile", str(key),
                 "--keyfile-password", "wrong")
    assert r.returncode == 2, r.stderr
    assert f"keyfile {key}" in r.stderr or str(key) in r.stderr


def test_tls_for_a_stream_app_is_refused(tmp_path, site):
    r = run_once(tmp_path, "--interface", "stream", *tls_args(tmp_path))
    assert r.returncode == 2, r.stderr
    assert "TLS is served for the HTTP interfaces" in r.stderr


class TlsClients(LoopClients):
    """load_clients.LoopClients over HTTPS, every other one fresh (so each
    sees the certificate served now); `cns`: the certificate CN of every
    answer, in order."""

    def __init__(self, port: int, ctx: ssl.SSLContext, n: int = 3):
        self.cns: list[str] = []
        super().__init__(lambda: http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                                             context=ctx),
                         [i % 2 == 0 for i in range(n)])

    def seen(self, conn) -> str:
        return dict(x[0] for x in conn.sock.getpeercert()["subject"])["commonName"]

    def check(self, body: bytes, cn: str) -> str | None:
        if body != b"https":
            return f"body {body!r}"
        self.cns.append(cn)
        return None


def test_rotating_the_certificate_is_a_hup_with_no_failed_request(master, tmp_path, site):
    m = master("tlsapp:app", "-w", "2", *tls_args(tmp_path))
    new = make_pki(tmp_path / "pki2", "second", ca=site.ca)
    with under_load(TlsClients(m.port, site.context()), 30) as clients:
        shutil.copy(new.cert, tmp_path / "live.crt")
        shutil.copy(new.key, tmp_path / "live.key")
        m.proc.send_signal(signal.SIGHUP)
        m.wait_log(r"reload: generation 2 serving")
        wait_for(lambda: "second" in clients.cns[-5:], 20, "the new certificate served")
    assert served_cn(m.port, site) == "second"


@pytest.mark.parametrize("breakage", ["missing", "mismatched"])
def test_a_broken_certificate_refuses_the_reload(master, tmp_path, site, breakage):
    m = master("tlsapp:app", "-w", "2", *tls_args(tmp_path))
    serving = set(children(m.proc.pid))
    with under_load(TlsClients(m.port, site.context(), n=2), 10):
        if breakage == "missing":
            (tmp_path / "live.crt").unlink()
            reason = rf"certfile {tmp_path / 'live.crt'}: No such file or directory"
        else:
            other = make_pki(tmp_path / "other", "other")
            shutil.copy(other.key, tmp_path / "live.key")
            reason = rf"keyfile {tmp_path / 'live.key'} does not match"
        m.proc.send_signal(signal.SIGHUP)
        m.wait_log(r"reload refused \(generation 2\): .*" + reason.replace(".", r"\."))
        m.wait_log(r"generation 1 keeps serving")
        assert set(children(m.proc.pid)) == serving
    assert served_cn(m.port, site) == "first"


def test_a_gunicorn_config_with_tls_runs_unchanged(tmp_path, site):
    """gunicorn's TLS names in a gunicorn.conf.py (cert_reqs as Python's
    ssl.CERT_* number) are ours; they were refused before TLS existed."""
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("import ssl\n"
                    f"certfile = {str(tmp_path / 'live.crt')!r}\n"
                    f"keyfile = {str(tmp_path / 'live.key')!r}\n"
                    f"ca_certs = {str(site.ca_file)!r}\n"
                    "cert_reqs = ssl.CERT_REQUIRED\n"
                    "ciphers = 'ECDHE+AESGCM'\n")
    r = subprocess.run([sys.executable, "-m", "sockherd.master", "check", "-c", str(conf),
                        "--print-config", "tlsapp:app"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = {k.strip(): v.strip() for k, _, v in
             (line.partition(" = ") for line in r.stdout.splitlines()) if v}
    assert lines["cert_reqs"].startswith('"required"'), lines["cert_reqs"]
    assert lines["ciphers"].startswith('"ECDHE+AESGCM"'), lines["ciphers"]


def test_a_session_resumes_on_any_worker(master, tmp_path, site):
    """The workers share the session-ticket keys the master made (tlsbench's
    finding: each worker had keys of its own, so with -w 2 a client's next
    connection, landing on the other worker, resumed 0 times in 20). Each
    connection offers the session of the one before; the kernel spreads them
    over both workers; every one resumes."""
    m = master("tlsapp:app", "-w", "2", *tls_args(tmp_path))
    ctx = site.context()
    session, resumed = None, 0
    for _ in range(20):
        raw = socket.create_connection(("127.0.0.1", m.port), timeout=10)
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1", session=session) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            head, body = read_response(s)
            assert body == b"https"
            resumed += s.session_reused
            session = s.session          # TLS 1.3: its ticket came with the answer
    assert resumed >= 19, f"{resumed} of 20 connections resumed"


def test_a_respawned_worker_serves_what_its_generation_read(master, tmp_path, site):
    """The master reads the TLS files once per generation (issue 35
    review): a worker that dies between two reloads is replaced by one
    serving the same certificate, and the master does not open the files
    again, even when what the paths name now is a symlink to a root-only
    file of another kind. Only a HUP reads them, and refuses that one."""
    import os

    m = master("tlsapp:app", "-w", "1", *tls_args(tmp_path), ready=1)
    assert served_cn(m.port, site) == "first"
    secret = tmp_path / "shadow"
    secret.write_bytes(b"root:$6$not-a-key$hash:19000:0:99999:7:::\n")
    os.chmod(secret, 0o600)
    for name in ("live.crt", "live.key"):
        (tmp_path / name).unlink()
        (tmp_path / name).symlink_to(secret)          # what a worker's user could plant
    (old,) = children(m.proc.pid)
    os.kill(old, signal.SIGKILL)
    m.wait_log(r"worker 1\.0: ready, pid (?!%d\b)\d+" % old)
    assert served_cn(m.port, site) == "first"
    assert "no PEM block" not in m.text()
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload refused \(generation 2\): ")
    text = m.text()
    assert "hash:19000" not in text and str(secret) not in text, text
    assert served_cn(m.port, site) == "first"
