#!/usr/bin/env python3
"""tls_hello: HTTPS hello world of sockherd against granian, uvicorn and
gunicorn with TLS, in the same run (issue 24 §2).

    .venv/bin/python bench/tls_hello.py [--seconds 6] [--rounds 3] [--only a,b]
        [--loads ka-c50,resume-c50,full-c50] [--key rsa2048|ec256] [--wait-quiet S]
        [--checkout DIR] [--json rows.json]

A certificate is made at bench time (openssl CLI, in a temporary directory):
self-signed for 127.0.0.1, an RSA 2048 key (--key ec256: ECDSA P-256), the
key in PKCS#8 (granian reads no other form). Every server gets that pair, 2
worker processes and its defaults otherwise (TLS 1.3 is what each negotiates
with wrk and the client here; the report shows each one's protocol, cipher
and key exchange from `openssl s_client`, and whether it resumes a session):

  sockherd-wsgi     sockherd run hello:app -w 2 --threads 1 --certfile C --keyfile K
  sockherd-asgi     sockherd run hello:asgi --interface asgi -w 2 --threads 1 (same TLS flags)
  granian-wsgi      granian --interface wsgi --workers 2 --ssl-certificate C --ssl-keyfile K
  granian-asgi      granian --interface asgi ... (the same)
  uvicorn           uvicorn hello:asgi --workers 2 --http httptools --loop uvloop
                    --no-access-log --ssl-certfile C --ssl-keyfile K
  gunicorn-gthread  gunicorn -w 2 -k gthread --threads 4 --certfile C --keyfile K hello:app
  gunicorn-sync     gunicorn -w 2 --certfile C --keyfile K hello:app (sync workers answer
                    every request with Connection: close: its ka-c50 row is new
                    connections, resumed by wrk, too)

sockherd is measured from this checkout or --checkout DIR (its
.venv/bin/sockherd); a sockherd whose `run --help` has no --certfile is left
out with a note. Ratios are to granian of the same interface, paired per
round: WSGI rows (sockherd-wsgi, gunicorn-*) to granian-wsgi, ASGI rows
(sockherd-asgi, uvicorn) to granian-asgi.

Loads, 50 connections each:

  ka-c50      wrk -t2 -c50 keep-alive over https: TLS records, no handshake
              after each connection's first
  resume-c50  wrk -t2 -c50 -H 'Connection: close': a new connection per
              request. wrk keeps each connection's SSL object across its
              reconnects (SSL_clear keeps the session), so where the server
              issues session tickets these are RESUMED handshakes (TLS 1.3
              PSK with ECDHE: no certificate, no signature). Checked against a
              Python ssl server counting session_reused: 543 of 545 wrk
              reconnects were resumed.
  full-c50    bench/tls_handshake_client.c (gcc -O2, OpenSSL): 50 threads,
              each in a closed loop: connect, a FULL handshake (a fresh SSL
              object, no session kept, no ticket asked for), GET / with
              Connection: close, the whole response, close_notify, close.
              Handshakes/s = its requests/s; it counts resumed handshakes
              (must be 0) and checks each answer (200, the hello body).

Is the client the bottleneck? On 2 cores the client and the server share the
box, so req/s is what the box does with both on it; per row the report gives
the client's CPU per request beside the server's, and requests per server
CPU-second, which does not depend on how much the client takes and is the
figure to compare. Measured (2026-11-26, OpenSSL 3.0.19): the client's CPU
per full handshake is about the server's, 1.0-1.5 ms, with RSA as with ECDSA
(the signature check is 25-90 µs of it: OpenSSL 3.0's per-connection work
dominates). It keeps 50 handshakes in flight, so the server always has one
queued: the client is not what limits the server's rate.

Every row goes through bench/http_hello.py's measurement (the server tree's
CPU from /proc, wrk's or the client's CPU, the box's busy cores, `other`: what
other processes took; a disturbed row is measured again) and
bench/rotations.py's rounds (the servers' order turned by one each round;
medians and ranges over rounds, ratios paired within a round).

Exit status: 0; 1 when a sockherd row had errors or a failed probe, or a
server stopped answering; 2 for a set-up problem.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import time

import benchlib as B
import http_hello as H
import rotations as R

SERVERS = ("sockherd-wsgi", "sockherd-asgi", "granian-wsgi", "granian-asgi", "uvicorn",
           "gunicorn-gthread", "gunicorn-sync")
BASES = {"sockherd-wsgi": "granian-wsgi", "gunicorn-gthread": "granian-wsgi",
         "gunicorn-sync": "granian-wsgi", "sockherd-asgi": "granian-asgi",
         "uvicorn": "granian-asgi"}
KEYS = {"rsa2048": ["-newkey", "rsa:2048"],
        "ec256": ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]}


def make_cert(tmp: str, key: str) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and its key (PKCS#8, unencrypted)."""
    cert, keyf = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    r = subprocess.run(["openssl", "req", "-x509", *KEYS[key], "-nodes", "-keyout", keyf,
                        "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise B.BenchError(f"openssl req failed: {r.stderr.strip()[-500:]}")
    return cert, keyf


def spec_for(server: str, checkout: str, tmp: str, cert: str, key: str):
    """The spec function http_hello.Server takes (argv, readiness, description)."""
    w = str(H.WORKERS)
    wsgi = server in ("sockherd-wsgi", "granian-wsgi", "gunicorn-gthread", "gunicorn-sync")
    target = "hello:app" if wsgi else "hello:asgi"

    def spec(port: int) -> dict:
        bind = f"127.0.0.1:{port}"
        if server.startswith("sockherd"):
            sh = os.path.join(checkout, ".venv", "bin", "sockherd")
            iface = [] if wsgi else ["--interface", "asgi"]
            return {"argv": [sh, "run", target, *iface, "-w", w, "--threads", "1", "-b", bind,
                             "--pythonpath", B.APPS, "--certfile", cert, "--keyfile", key,
                             "--runtime-dir", os.path.join(tmp, f"run-{server}")],
                    "ready": (r"worker \d+\.\d+: ready, pid", H.WORKERS), "tls": True,
                    "desc": f"sockherd run {target} {' '.join(iface)} -w {w} --threads 1 "
                            "--certfile C --keyfile K".replace("  ", " ")}
        if server.startswith("granian"):
            iface = "wsgi" if wsgi else "asgi"
            return {"argv": [H.peer_bin("granian"), "--interface", iface, "--workers", w,
                             "--host", "127.0.0.1", "--port", str(port),
                             "--ssl-certificate", cert, "--ssl-keyfile", key,
                             "--working-dir", B.APPS, target],
                    "ready": (r"Started worker-\d+", H.WORKERS), "tls": True,
                    "desc": f"granian --interface {iface} --workers {w} --ssl-certificate C "
                            f"--ssl-keyfile K {target}"}
        if server == "uvicorn":
            return {"argv": [H.peer_bin("uvicorn"), target, "--app-dir", B.APPS,
                             "--host", "127.0.0.1", "--port", str(port), "--workers", w,
                             "--http", "httptools", "--loop", "uvloop", "--no-access-log",
                             "--ssl-certfile", cert, "--ssl-keyfile", key],
                    "ready": (r"Application startup complete", H.WORKERS), "tls": True,
                    "desc": f"uvicorn {target} --workers {w} --http httptools --loop uvloop "
                            "--no-access-log --ssl-certfile C --ssl-keyfile K"}
        if server.startswith("gunicorn"):
            kind = ["-k", "gthread", "--threads", "4"] if server == "gunicorn-gthread" else []
            return {"argv": [H.peer_bin("gunicorn"), "-w", w, *kind, "-b", bind,
                             "--certfile", cert, "--keyfile", key,
                             "--chdir", B.APPS, "--no-control-socket", target],
                    "ready": (r"Booting worker with pid", H.WORKERS), "tls": True,
                    "desc": f"gunicorn -w {w} {' '.join(kind)} --certfile C --keyfile K "
                            f"{target}".replace("  ", " ")}
        raise ValueError(server)
    return spec


def sockherd_skip(checkout: str) -> str:
    """Why this checkout's sockherd cannot be measured with TLS, or ''."""
    sh = os.path.join(checkout, ".venv", "bin", "sockherd")
    if not os.path.exists(sh):
        return f"{sh} missing (`sh make.sh test` in that checkout)"
    r = subprocess.run([sh, "run", "--help"], capture_output=True, text=True, timeout=60)
    if "--certfile" not in r.stdout:
        return f"`{sh} run --help` has no --certfile: no TLS in that tree (branch tls)"
    return ""


def tls_info(srv: H.Server) -> str:
    """What the server negotiates with OpenSSL's defaults (the client's too):
    protocol, cipher, key exchange (`openssl s_client -brief`); and whether a
    second connection with the first one's session is resumed."""
    r = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{srv.port}", "-brief"],
                       input="", capture_output=True, text=True, timeout=20)
    got = dict(re.findall(r"^(Protocol version|Ciphersuite|Server Temp Key|Signature type): "
                          r"(.*)$", r.stderr + r.stdout, re.M))
    info = ", ".join(got.get(k, "?") for k in ("Protocol version", "Ciphersuite",
                                               "Server Temp Key", "Signature type"))
    return f"{info}; sessions resumed: {resumes(srv)}"


def resumes(srv: H.Server, tries: int = 10) -> str:
    """How many of `tries` new connections, each offering the session of the
    one before (as wrk's reconnects do), are resumed. A worker process with
    session-ticket keys (or a session cache) of its own resumes only its own
    sessions: with 2 such workers, about half. The session is taken after a
    whole request (TLS 1.3 tickets come after the handshake)."""
    req = H.request_bytes(srv.port, [])

    def one(sess):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=3) as raw, \
                srv.tls.wrap_socket(raw, session=sess) as s:
            s.sendall(req)
            buf = b""
            while H.HELLO not in buf:
                d = s.recv(65536)
                if not d:
                    break
                buf += d
            return s.session, s.session_reused
    try:
        sess, _ = one(None)
        n = 0
        for _ in range(tries):
            sess, reused = one(sess)
            n += reused
        return f"{n}/{tries}"
    except OSError as e:
        return f"? ({type(e).__name__}: {e})"


def handshake_client(binary: str):
    def client_for(srv: H.Server):
        return lambda seconds: [binary, str(srv.port), "50", f"{seconds:g}"]
    return client_for


def main() -> int:
    ap = R.parser(__doc__, SERVERS)
    ap.add_argument("--loads", default="ka-c50,resume-c50,full-c50",
                    help="loads (default: all): ka-c50,resume-c50,full-c50")
    ap.add_argument("--key", choices=sorted(KEYS), default="rsa2048",
                    help="the certificate's key (rsa2048)")
    a = ap.parse_args()
    only = R.chosen(ap, a, SERVERS)
    loads_all = {"ka-c50": ("ka-c50", None), "resume-c50": ("close-c50", None),
                 "full-c50": ("close-c50", None)}
    loads = {}
    for ld in (x for x in a.loads.split(",") if x):
        if ld not in loads_all:
            ap.error(f"unknown load {ld!r}")
        loads[ld] = loads_all[ld]
    if "full-c50" in loads:
        loads["full-c50"] = ("close-c50", handshake_client(
            B.build_c("tls_handshake_client", ["-pthread"], ["-lssl", "-lcrypto"])))
    checkout = os.path.abspath(a.checkout)
    skip = sockherd_skip(checkout) if any(s.startswith("sockherd") for s in only) else ""
    if skip:
        only = [s for s in only if not s.startswith("sockherd")]
    R.check_tools(only)
    quiet = H.wait_quiet(a.wait_quiet) if a.wait_quiet > 0 else ""
    head = B.header(f"tls_hello: HTTPS hello, 2 worker processes each, {a.key} certificate")
    load0 = R.loadavg()
    vers = H.versions()
    t_start = time.monotonic()
    infos, stops = {}, {}
    with B.Procs() as procs, B.tempdir("tls_hello-") as tmp:
        cert, key = make_cert(tmp, a.key)
        specs = {s: (spec_for(s, checkout, tmp, cert, key), H.HELLO) for s in only}
        servers, results, failures = R.run(procs, tmp, specs, loads, a, t_start)
        for name, srv in servers.items():
            if not srv.failed:
                infos[name] = tls_info(srv)
            stops[name] = srv.stop()
    elapsed = time.monotonic() - t_start

    ossl = subprocess.run(["openssl", "version"], capture_output=True, text=True).stdout
    R.print_head(head, quiet, load0, f"{vers}; {ossl.strip()}", a, elapsed)
    if skip:
        print(f"- **sockherd not measured**: {skip}")
    print("- servers (TLS as negotiated with OpenSSL's client defaults):")
    for name, srv in servers.items():
        print(f"  - {name}: `{srv.spec['desc']}`; {infos.get(name, '?')}; stop: "
              f"{stops.get(name, '?')}")
    print("- ratios: to granian of the same interface in the same round (WSGI rows to "
          "granian-wsgi, ASGI rows to granian-asgi); `client CPU µs per req`: wrk's or "
          "tls_handshake_client's CPU over the row's requests")
    names = list(servers)
    for ld in loads:
        print(f"\n#### {ld}\n")
        print(R.summary(results, ld, BASES, names))
    return R.finish(results, failures, loads, a)


if __name__ == "__main__":
    B.run_main(main, "tls_hello")
