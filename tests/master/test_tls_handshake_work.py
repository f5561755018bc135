"""What a full TLS handshake makes a worker do (issue 24 §2, the
new-connection rate against granian; worker/native/conn/conn_tls.c,
Server_set_tls): work that is the same for every connection is done once
per context, not per handshake, and what the client gets is unchanged.

Findings reproduced (bench/RESULTS.md, "issue 24: where a full
handshake's CPU goes"):
  - a certfile holding only its leaf made OpenSSL build the chain in every
    handshake (an X509_STORE_CTX and X509_verify_cert against the
    context's store): counted here by an interposed X509_verify_cert in the
    worker, none may run while handshakes are served; the chain a client
    gets is still the one that build gave (the leaf, and the issuer when
    ca_certs holds it; a certfile's own chain as it is);
  - each full handshake issued two TLS 1.3 session tickets (OpenSSL's
    default), each an i2d/d2i of the session, an AES-CBC encryption and an
    HMAC: one is issued now, and a client resumes with it, each resumed
    handshake giving the next ticket.
"""
from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess

import pytest
import trustme

from test_run import master, wait_for  # noqa: F401 (fixture)
from tls_support import make_pki, read_response

pytestmark = pytest.mark.timeout(120)

APP = """
def app(environ, start_response):
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]
"""

# Counts X509_verify_cert calls in the process it is preloaded into (an
# O_APPEND byte per call to the file named by TLS_VERIFY_COUNT), then
# calls OpenSSL's own: libssl reaches libcrypto's exported function
# through its PLT, so the preloaded definition is the one it runs.
# libcrypto comes with an extension module (dlopen, RTLD_LOCAL): out of
# RTLD_NEXT's reach, so it is found by name, already loaded.
COUNTER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

int X509_verify_cert(void *ctx)
{
	static int (*real)(void *);
	const char *path = getenv("TLS_VERIFY_COUNT");

	if (!real) {
		void *h = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_NOLOAD);

		real = (int (*)(void *))dlsym(h ? h : RTLD_NEXT, "X509_verify_cert");
		if (!real)
			abort();
	}
	if (path) {
		int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);

		if (fd >= 0) {
			if (write(fd, "v", 1) < 0) {}
			close(fd);
		}
	}
	return real(ctx);
}
"""


@pytest.fixture
def site(tmp_path):
    (tmp_path / "tlsapp.py").write_text(APP)
    return make_pki(tmp_path / "pki")


def get(port: int, ctx: ssl.SSLContext, session=None) -> tuple[ssl.SSLSession, bool]:
    """One GET on a new connection (offering session, when given): the
    session after it, and whether the handshake resumed."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s = ctx.wrap_socket(raw, server_hostname="127.0.0.1", session=session)
    except BaseException:
        raw.close()
        raise
    with s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head, body = read_response(s)
        assert head.startswith(b"HTTP/1.1 200") and body == b"ok"
        # TLS 1.3 tickets come after the handshake: read to the end so
        # every one the server sent has been taken in
        while s.recv(4096):
            pass
        return s.session, s.session_reused


def chain_sent(port: int) -> int:
    """How many certificates the server sends (openssl s_client -showcerts)."""
    tool = shutil.which("openssl")
    if not tool:
        pytest.skip("openssl is not installed")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    r = subprocess.run([tool, "s_client", "-connect", f"127.0.0.1:{port}", "-showcerts"],
                       input="", capture_output=True, text=True, timeout=30, env=env)
    assert "BEGIN CERTIFICATE" in r.stdout, r.stdout + r.stderr
    return r.stdout.count("BEGIN CERTIFICATE")


def test_no_certificate_chain_is_built_per_handshake(master, tmp_path, site, monkeypatch):
    gcc = shutil.which("gcc")
    if not gcc:
        pytest.skip("gcc is not installed")
    lib, count = tmp_path / "verify_count.so", tmp_path / "verify.count"
    (tmp_path / "verify_count.c").write_text(COUNTER_C)
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-o", str(lib),
                    str(tmp_path / "verify_count.c"), "-ldl"], check=True, timeout=60)
    monkeypatch.setenv("LD_PRELOAD", str(lib))
    monkeypatch.setenv("TLS_VERIFY_COUNT", str(count))
    m = master("tlsapp:app", "-w", "1", "--certfile", str(site.cert), "--keyfile",
               str(site.key), ready=1)
    monkeypatch.delenv("LD_PRELOAD")
    ctx = site.context()
    get(m.port, ctx)                       # the worker is serving
    before = count.read_bytes() if count.exists() else b""
    for _ in range(10):
        get(m.port, ctx)
    after = count.read_bytes() if count.exists() else b""
    assert len(after) - len(before) == 0, \
        f"{len(after) - len(before)} chain builds in 10 full handshakes"


@pytest.mark.parametrize("with_ca", [False, True])
def test_the_chain_sent_is_the_leaf_and_the_issuer_found_in_ca_certs(master, tmp_path, site,
                                                                      with_ca):
    more = ["--ca-certs", str(site.ca_file), "--cert-reqs", "optional"] if with_ca else []
    m = master("tlsapp:app", "-w", "1", "--certfile", str(site.cert), "--keyfile",
               str(site.key), *more, ready=1)
    assert chain_sent(m.port) == (2 if with_ca else 1)


def test_a_certfile_with_its_chain_is_sent_as_it_is(master, tmp_path):
    (tmp_path / "tlsapp.py").write_text(APP)
    root = trustme.CA()
    pki = make_pki(tmp_path / "pki", ca=root.create_child_ca())
    assert pki.cert.read_text().count("BEGIN CERTIFICATE") == 2      # leaf, intermediate
    m = master("tlsapp:app", "-w", "1", "--certfile", str(pki.cert), "--keyfile",
               str(pki.key), ready=1)
    assert chain_sent(m.port) == 2


def test_a_full_handshake_issues_one_ticket_and_resumption_chains_on(master, tmp_path, site):
    m = master("tlsapp:app", "-w", "2", "--certfile", str(site.cert), "--keyfile",
               str(site.key))
    tickets = []
    ctx = site.context()
    ctx._msg_callback = lambda conn, direction, version, ctype, mtype, data: (
        tickets.append(1) if direction == "read" and ctype == ssl._TLSContentType.HANDSHAKE
        and mtype == ssl._TLSMessageType.NEWSESSION_TICKET else None)
    session, reused = get(m.port, ctx)
    assert not reused and len(tickets) == 1, f"{len(tickets)} tickets after a full handshake"
    for i in range(6):                    # either worker: the ticket keys are shared
        tickets.clear()
        session, reused = get(m.port, ctx, session)
        assert reused, f"reconnection {i + 1} was a full handshake"
        assert len(tickets) == 1
