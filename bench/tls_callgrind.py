#!/usr/bin/env python3
"""tls_callgrind: instructions per full TLS handshake (a new connection with
one hello request), counted by callgrind in sockherd's worker (issue 24 §2):
a before/after figure that does not depend on the box's load.

    .venv/bin/python bench/tls_callgrind.py [--checkout DIR[::ARGS] ...]
        [--key rsa2048|ec256] [--seconds 20] [--conns 1] [--keep DIR]

For each --checkout DIR (repeatable; default this checkout; the first is the
baseline of the ratios; `DIR::ARGS` appends ARGS to that row's `sockherd
run`), `DIR/.venv/bin/sockherd run hello:app -w 1 --threads 1 --certfile C
--keyfile K` runs under `nice -n 19 valgrind --tool=callgrind
--trace-children=yes`, with tls_hello.py's certificate (made by the run)
and http_callgrind.py's long ready and heartbeat timeouts.
bench/tls_handshake_client.c drives it: an uncounted run of 3 s,
`callgrind_control -z` on the worker, a run of --seconds with --conns
connections in a closed loop (each a full handshake, never resumed, `GET /`
with Connection: close, the whole answer, close_notify, close; with one
connection no handshake straddles the count's ends), `callgrind_control -d`
once the worker's loop sleeps again. The figure is the dump's total Ir /
the client's handshakes: the worker's user space (OpenSSL, the engine,
Python, libc), not the kernel. --keep DIR keeps the dumps for
`callgrind_annotate --inclusive=yes DUMP` (Debian's libcrypto has no
symbols for its internal functions: exported ones anchor the tree).

Prints a Markdown table: per checkout the Ir per handshake and the ratio to
the first. Every process is killed and reaped on the way out.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys

import benchlib as B
from http_callgrind import (counted, epoll_sleepers, git_line, sockherd_argv,
                            start_counted, stop)
from tls_hello import KEYS, make_cert


def count(procs: B.Procs, tmp: str, client: str, checkout: str, extra: list[str],
          cert: str, key: str, tag: str, a) -> tuple[float, int]:
    """One server under callgrind: (Ir per handshake, handshakes counted)."""
    port = B.free_port()
    pattern = os.path.join(a.keep or tmp, f"cg-{tag}.")
    argv = sockherd_argv(checkout, "hello:app", port, tmp, tag) + [
        "-w", "1", "--threads", "1", "--certfile", cert, "--keyfile", key, *extra]
    p, pid = start_counted(procs, tmp, pattern, argv, tag, a.timeout)

    def run(seconds: float) -> int:
        r = subprocess.run([client, str(port), str(a.conns), f"{seconds:g}"],
                           capture_output=True, text=True, timeout=a.timeout)
        m = re.search(r"requests=(\d+) .*connect=(\d+) .*status=(\d+)", r.stdout)
        if r.returncode != 0 or not m or m.group(2) != "0" or m.group(3) != "0":
            raise B.BenchError(f"{tag}: handshake client failed: {r.stdout} {r.stderr}")
        return int(m.group(1))

    def idle():
        B.wait_for(lambda: epoll_sleepers(pid) >= 1 or None, a.timeout, f"{tag} idle",
                   interval=0.1)

    # the worker answers an instant after it logs ready: the warm-up waits
    B.wait_for(lambda: B.can_connect(port), a.timeout, f"{tag} listening", interval=0.2)
    run(3)
    idle()
    n, ir, dump = counted(pid, pattern, tag, a.timeout, lambda: (run(a.seconds), idle())[0])
    stop(procs, p, a.timeout)
    print(f"# {tag}: {ir / n:,.0f} Ir per handshake ({n} handshakes)"
          + (f", dump {dump}" if a.keep else ""), file=sys.stderr, flush=True)
    return ir / n, n


def main() -> int:
    ap = B.arg_parser(__doc__)
    ap.add_argument("--checkout", action="append", default=[], metavar="DIR",
                    help="run sockherd from DIR/.venv (repeatable; DIR::ARGS; the first is "
                         "the baseline; default: this checkout)")
    ap.add_argument("--key", choices=sorted(KEYS), default="rsa2048")
    ap.add_argument("--seconds", type=float, default=20, help="the counted run (20)")
    ap.add_argument("--conns", type=int, default=1, help="client connections (1)")
    ap.add_argument("--keep", metavar="DIR", help="keep the callgrind dumps in DIR")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        raise B.BenchError("valgrind (Debian package valgrind) is needed")
    specs = [c.partition("::") for c in a.checkout] or [(B.ROOT, "", "")]
    paths = [os.path.abspath(c) for c, _, _ in specs]
    extras = [shlex.split(x) for _, _, x in specs]
    labels = [f"{os.path.basename(p)}{' ' + ' '.join(x) if x else ''}#{i + 1}"
              for i, (p, x) in enumerate(zip(paths, extras))]
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
    client = B.build_c("tls_handshake_client", ["-pthread"], ["-lssl", "-lcrypto"])
    head = B.header(f"tls_callgrind: instructions per full handshake, {a.key} certificate "
                    "(the worker's user space)")
    res = []
    with B.Procs() as procs, B.tempdir("tls_callgrind-") as tmp:
        cert, key = make_cert(tmp, a.key)
        for pth, lb, x in zip(paths, labels, extras):
            res.append(count(procs, tmp, client, pth, x, cert, key,
                             re.sub(r"[^\w.-]+", "_", lb)[:60], a))
    print(head)
    for pth, lb in zip(paths, labels):
        print(f"- {lb}: {pth}, {git_line(pth)}")
    ossl = subprocess.run(["openssl", "version"], capture_output=True, text=True).stdout.strip()
    vg = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"- -w 1 --threads 1, {a.conns} client connection(s), {a.seconds:g} s counted; {ossl}; {vg}\n")
    print(B.table(["checkout", "Ir per handshake", "handshakes", f"/ {labels[0]}"],
                  [[lb, f"{ir:,.0f}", n, f"{ir / res[0][0]:.3f}"]
                   for lb, (ir, n) in zip(labels, res)]))
    print(B.footer())
    return 0


if __name__ == "__main__":
    B.run_main(main, "tls_callgrind")
