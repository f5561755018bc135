#!/usr/bin/env python3
"""echo_callgrind: instructions per echo, counted by callgrind: a figure that
does not depend on the machine's load (issue 20's before/after; the
wall-clock echo_bench.py is noise on a shared 2-core box).

    .venv/bin/python bench/echo_callgrind.py [--only sockherd,asyncio,uvloop,c]
        [--small 10000] [--bulk 1000]

Each server runs with ONE process under `valgrind --tool=callgrind
--trace-children=yes` at nice 19:

  sockherd   `sockherd run echo:Echo --interface stream -w 1 --threads 1 --control off`
             (ready and heartbeat timeouts 600 s: valgrind is slow)
  asyncio    bench/asyncio_echo.py --procs 1 --loop asyncio
  uvloop     bench/asyncio_echo.py --procs 1 --loop uvloop
  c          bench/c_echo_ref.c with 1 process

One Python client connection sends a message, reads the same bytes back
(checked) and sends the next, one at a time. Per load: a warm-up of 200
echoes, `callgrind_control -z` on the serving process, N echoes,
`callgrind_control -d`; the figure is the dump's total Ir / N. It counts the
serving process's user space (every thread: Python, the engine, libc), not
the kernel's side of the read and the write (about half of an echo's CPU
for the C server, see RESULTS.md). PYTHONHASHSEED=0 everywhere. Loads:
small (64-byte messages, --small echoes) and bulk (64 KiB, --bulk echoes).
Prints a Markdown table with each server's Ir per echo and the ratios to
uvloop and C. Every process is killed and reaped on the way out.
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys

import benchlib as B

SIZES = {"small": 64, "bulk": 65536}


def echo(sock: socket.socket, msg: bytes, n: int) -> None:
    for _ in range(n):
        sock.sendall(msg)
        got = b""
        while len(got) < len(msg):
            chunk = sock.recv(len(msg) - len(got))
            if not chunk:
                raise B.BenchError("the server closed the connection")
            got += chunk
        if got != msg:
            raise B.BenchError("echo mismatch")


def total_ir(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise B.BenchError(f"no totals in {path}")


def serving_pid(root: int, kind: str) -> int:
    """The process that serves the connections: the worker (sockherd), the
    forked child (asyncio, uvloop, c); valgrind runs each as itself."""
    procs = B.tree(root)
    if len(procs) < 2:
        raise B.BenchError(f"{kind}: no child process under {root}")
    return procs[-1]


def run_one(procs: B.Procs, tmp: str, kind: str, a) -> dict:
    port = B.free_port()
    log = os.path.join(tmp, f"{kind}.log")
    out = os.path.join(tmp, f"{kind}.out")
    cgout = os.path.join(tmp, f"cg-{kind}.%p")
    vg = ["nice", "-n", "19", "valgrind", "--tool=callgrind", "--trace-children=yes",
          f"--callgrind-out-file={cgout}"]
    if kind == "sockherd":
        argv = B.sockherd_argv("echo:Echo", port, workers=1, threads=1,
                               extra=["--control", "off", "--ready-timeout", "600",
                                      "--heartbeat-timeout", "600"])
    elif kind == "c":
        argv = [B.build_c("c_echo_ref"), str(port), "1"]
    else:
        argv = [B.PEERS_PY, os.path.join(B.HERE, "asyncio_echo.py"), "--port", str(port),
                "--procs", "1", "--loop", kind]
    env = dict(os.environ, PYTHONHASHSEED="0")
    with open(out, "wb") as f:
        p = procs.start(vg + argv, log_path=log, stdout=f, env=env)
    if kind == "sockherd":
        B.wait_sockherd_ready(p, log, 1, timeout=a.timeout)
    else:
        B.wait_for(lambda: "ready" in B.read_text(out) or p.poll() is not None, a.timeout,
                   f"{kind} ready")
    B.wait_for(lambda: B.can_connect(port) or p.poll() is not None, a.timeout,
               f"{kind} answering")
    if p.poll() is not None:
        raise B.BenchError(f"{kind} exited {p.returncode}: {B.read_text(log)[-2000:]}")
    pid = serving_pid(p.pid, kind)
    res = {"server": kind, "pid": pid}
    with socket.create_connection(("127.0.0.1", port), timeout=a.timeout) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for load in a.loads:
            msg = bytes(i & 0xFF for i in range(SIZES[load]))
            n = a.small if load == "small" else a.bulk
            echo(s, msg, 200)
            subprocess.run(["callgrind_control", "-z", str(pid)], check=True,
                           capture_output=True, timeout=a.timeout)
            echo(s, msg, n)
            before = set(glob.glob(os.path.join(tmp, f"cg-{kind}.{pid}*")))
            subprocess.run(["callgrind_control", "-d", str(pid)], check=True,
                           capture_output=True, timeout=a.timeout)
            dump = B.wait_for(lambda: sorted(set(glob.glob(os.path.join(
                tmp, f"cg-{kind}.{pid}*"))) - before), a.timeout, f"{kind} dump")[-1]
            res[load] = total_ir(dump) / n
            print(f"# {kind} {load}: {res[load]:,.0f} Ir per echo ({n} echoes)",
                  file=sys.stderr, flush=True)
    procs.stop(p, timeout=a.timeout)
    return res


def main() -> int:
    ap = B.arg_parser(__doc__)
    ap.add_argument("--only", default="sockherd,asyncio,uvloop,c")
    ap.add_argument("--loads", default="small,bulk")
    ap.add_argument("--small", type=int, default=10000, help="64-byte echoes counted (10000)")
    ap.add_argument("--bulk", type=int, default=1000, help="64 KiB echoes counted (1000)")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds for each start, phase and stop under valgrind (600)")
    a = ap.parse_args()
    a.loads = [x.strip() for x in a.loads.split(",") if x.strip()]
    only = [x.strip() for x in a.only.split(",") if x.strip()]
    bad = [x for x in a.loads if x not in SIZES] + \
        [x for x in only if x not in ("sockherd", "asyncio", "uvloop", "c")]
    if bad:
        ap.error(f"unknown load or server: {', '.join(bad)}")
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        raise B.BenchError("valgrind (Debian package valgrind) is needed")
    B.check_sockherd()
    results = []
    with B.Procs() as procs, B.tempdir("echo_callgrind-") as tmp:
        head = B.header("echo_callgrind: instructions per echo (user space, one process)")
        for kind in only:
            print(f"# {kind}", file=sys.stderr, flush=True)
            results.append(run_one(procs, tmp, kind, a))
    ref = {r["server"]: r for r in results}
    print(head)
    print(f"- one connection, echoes one at a time; counted: {a.small:,} x 64 B, "
          f"{a.bulk:,} x 64 KiB after 200 uncounted; valgrind "
          f"{subprocess.run(['valgrind', '--version'], capture_output=True, text=True).stdout.strip()}\n")
    rows = []
    for r in results:
        row = [r["server"]]
        for load in a.loads:
            row.append(f"{r[load]:,.0f}")
            for k in ("uvloop", "c"):
                row.append(f"{r[load] / ref[k][load]:.2f}" if k in ref else "-")
        rows.append(row)
    cols = ["server"]
    for load in a.loads:
        cols += [f"{load}: Ir per echo", f"{load}: vs uvloop", f"{load}: vs c"]
    print(B.table(cols, rows))
    print(B.footer())
    return 0


if __name__ == "__main__":
    sys.exit(main())
