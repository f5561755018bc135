"""TLS with other real clients and clients that push the non-blocking
OpenSSL traps (issue 24 §2; worker/native/conn/conn_tls.c): curl and
`openssl s_client`, a reader with a tiny receive window taking a 10 MB
answer slowly (every write meets WANT_WRITE many times, and a retry must
offer the same bytes), a renegotiation request (refused:
SSL_OP_NO_RENEGOTIATION, the server serves on), and the PROXY protocol
header in clear ahead of the ClientHello."""
from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import time

import pytest

import proxy_reference as ref
from test_tls_http import BIG, CHUNK, app
from tls_support import make_pki, read_response, tls_connect

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


# the clients are not the code under test: never run them with the
# sanitizer's library preloaded (test_tls_asan.py runs this file)
CLIENT_ENV = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}


def need(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        pytest.skip(f"{tool} is not installed (make test installs it)")
    return path


def test_curl_keep_alive_and_a_large_answer(serve_wsgi, pki, tmp_path):
    _, addr = serve_wsgi(app, **pki.settings())
    url = f"https://127.0.0.1:{addr[1]}"
    out = tmp_path / "big"
    r = subprocess.run([need("curl"), "-sS", "--cacert", str(pki.ca_file), "-w", "%{http_code} ",
                        f"{url}/", f"{url}/env", "-o", "/dev/null", "-o", "/dev/null",
                        f"{url}/list", "-o", str(out), "-v"],
                       capture_output=True, text=True, timeout=60, env=CLIENT_ENV)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["200", "200", "200"]
    assert "Re-using existing connection" in r.stderr or "Reusing existing" in r.stderr
    assert "ALPN: server accepted http/1.1" in r.stderr
    assert out.read_bytes() == CHUNK * (BIG // len(CHUNK))


def test_openssl_s_client(serve_wsgi, pki):
    _, addr = serve_wsgi(app, **pki.settings())
    r = subprocess.run([need("openssl"), "s_client", "-connect", f"127.0.0.1:{addr[1]}",
                        "-CAfile", str(pki.ca_file), "-alpn", "http/1.1", "-quiet",
                        "-verify_return_error"],
                       input=b"GET /env HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                       capture_output=True, timeout=30, env=CLIENT_ENV)
    assert r.returncode == 0, r.stderr
    head, body = r.stdout.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 ")
    assert json.loads(body)["SSL_PROTOCOL"] == "TLSv1.3"


def test_openssl_s_client_tls_1_1_is_refused(serve_wsgi, pki):
    _, addr = serve_wsgi(app, **pki.settings())
    r = subprocess.run([need("openssl"), "s_client", "-connect", f"127.0.0.1:{addr[1]}",
                        "-tls1_1", "-cipher", "DEFAULT:@SECLEVEL=0"],
                       input=b"", capture_output=True, timeout=30)
    assert r.returncode != 0
    assert b"alert protocol version" in r.stderr, r.stderr
    assert b"no peer certificate available" in r.stdout


def test_renegotiation_is_refused_and_the_server_serves_on(serve_wsgi, pki):
    loop, addr = serve_wsgi(app, **pki.settings())
    proc = subprocess.Popen([need("openssl"), "s_client", "-connect", f"127.0.0.1:{addr[1]}",
                             "-tls1_2", "-CAfile", str(pki.ca_file)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=CLIENT_ENV)
    try:
        proc.stdin.write(b"R\n")                # s_client: renegotiate
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert b"RENEGOTIATING" in out
    assert b"no renegotiation" in out, out[-500:]
    with tls_connect(addr, pki.context()) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(s)[1] == b"hello https"


@pytest.mark.parametrize("threads", [1, 2])
def test_a_slow_reader_with_a_tiny_window_gets_every_byte(serve_wsgi, pki, threads):
    """The answer is 10 MB, the client's receive buffer 4 KiB and it reads
    1 KiB at a time: the server's writes meet WANT_WRITE thousands of
    times, each retried from the output's start (threads 2: a group of
    two, its connections shared and polled edge-triggered)."""
    _, addr = serve_wsgi(app, threads=threads, **pki.settings())
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.settimeout(30)
    raw.connect(addr)
    with pki.context().wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(b"GET /list HTTP/1.1\r\nHost: x\r\n\r\nGET /iter HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got, n = bytearray(), 0
        while chunk := s.recv(1024):
            got += chunk
            n += 1
            if n % 2048 == 0:
                time.sleep(0.005)
    want = CHUNK * (BIG // len(CHUNK))
    parts = bytes(got).split(b"\r\n\r\n")
    assert parts[1].startswith(want) and parts[2].startswith(want)
    assert bytes(got).endswith(b"hello https")
    assert len(got) > 2 * BIG


@pytest.mark.parametrize("header", [ref.v1("192.0.2.7", "127.0.0.1", 5555, 443),
                                    ref.v2("198.51.100.9", "127.0.0.1", 40000, 443)])
def test_a_proxy_protocol_header_then_tls(serve_wsgi, pki, header):
    """HAProxy's order: the header in clear, then the ClientHello."""
    _, addr = serve_wsgi(app, proxy_protocol="auto", proxy_allow_from=["127.0.0.0/8"],
                         **pki.settings())
    raw = socket.create_connection(addr, timeout=10)
    raw.sendall(header)
    with pki.context().wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(b"GET /env HTTP/1.1\r\nHost: x\r\n\r\n")
        seen = json.loads(read_response(s)[1])
    assert seen["REMOTE_ADDR"] in ("192.0.2.7", "198.51.100.9")
    assert seen["HTTPS"] == "on"


def test_a_missing_proxy_header_before_tls_closes(serve_wsgi, pki):
    _, addr = serve_wsgi(app, proxy_protocol="v2", proxy_allow_from=["127.0.0.0/8"],
                         **pki.settings())
    with pytest.raises((OSError,)):
        tls_connect(addr, pki.context()).close()


# ---- plaintext the session holds: no poll report announces it -----------------------------------

def pipelined(first: bytes, total: int) -> bytes:
    """first, then small pipelined GETs, the last one closing, padded to
    exactly total bytes."""
    small = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
    last = b"GET /env HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: %s\r\n\r\n"
    n = (total - len(first) - len(last % b"")) // len(small)
    body = first + small * n
    return body + last % (b"p" * (total - len(body) - len(last % b"")))


def send_as_records(addr, pki, data: bytes, split: int) -> bytes:
    """data as two TLS records, data[:split] and the rest (at most 16 KiB),
    sent in one write so both arrive together; then everything read to
    the end (a memory-BIO client: the records are ours to shape)."""
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = pki.context().wrap_bio(inc, out, server_hostname="127.0.0.1")
    with socket.create_connection(addr, timeout=15) as s:
        while True:
            try:
                obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                s.sendall(out.read())
                inc.write(s.recv(65536))
        s.sendall(out.read())
        obj.write(data[:split])
        obj.write(data[split:])
        s.sendall(out.read())
        got = bytearray()
        while True:
            try:
                chunk = obj.read(1 << 20)
                if not chunk:
                    break
                got += chunk
            except ssl.SSLWantReadError:
                try:
                    data_in = s.recv(1 << 20)
                except socket.timeout:
                    raise AssertionError(f"no more answers after {bytes(got[-200:])!r}")
                if not data_in:
                    break
                inc.write(data_in)
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break
    return bytes(got)


def test_a_read_that_fills_its_room_reads_what_the_session_still_holds(serve_wsgi, pki):
    """A record of 1000 bytes, then one of 16 KiB: the read's 16 KiB room
    takes the first and 15 KiB of the second; the rest is decrypted
    inside the session, the socket is empty, and no report will come: the
    codec reads again while the session holds bytes (threads 1: the
    connection is polled level-triggered, nothing else would read it)."""
    _, addr = serve_wsgi(app, threads=1, **pki.settings())
    data = pipelined(b"", 1000 + 16384)
    got = send_as_records(addr, pki, data, 1000)
    assert got.count(b"HTTP/1.1 200 ") == data.count(b"GET /"), got[-300:]
    assert got.endswith(b"}")


def test_reading_again_after_a_parked_body_reads_what_the_session_holds(serve_wsgi, pki):
    """The first request's answer is 10 MB (parked: reading stops) and the
    rest of the pipelined requests wait behind it, part of them decrypted
    inside the session: once the body is out and reading starts again,
    the connection is queued for a read of them (tls_replay)."""
    _, addr = serve_wsgi(app, threads=1, **pki.settings())
    data = pipelined(b"GET /list HTTP/1.1\r\nHost: x\r\n\r\n", 1000 + 16384)
    got = send_as_records(addr, pki, data, 1000)
    assert got.count(b"HTTP/1.1 200 ") == data.count(b"GET /"), got[-300:]
    assert got.endswith(b"}") and len(got) > BIG
