#!/usr/bin/env python3
"""hello_syscalls: what the kernel sees of a WSGI hello request: syscalls,
voluntary sleeps and CPU per request of the server's processes, counted by
`perf stat` (tracepoints) while wrk runs, against the C epoll reference.

    .venv/bin/python bench/hello_syscalls.py [--checkout DIR ...] [--c-ref]
        [--threads 1] [--workers 2] [--conns 50] [--seconds 5] [--rounds 2]

Each --checkout DIR (repeatable; default this checkout) runs `DIR/.venv/bin/
sockherd run hello:app -w W -t T` (this checkout's bench/apps/hello.py); with
--c-ref also bench/c_http_ref.c with W processes. Per round, every server in
turn (rounds alternate, so a loaded box disturbs each server alike): started,
probed, then `perf stat -e <tracepoints> -p <server pids>` around `wrk -t1
-cC -dS` keep-alive; per request: epoll_wait (+ epoll_pwait), read (+ recvfrom),
write (+ sendto, writev), epoll_ctl, futex, context switches (every sleep and
preemption of the server's threads), and CPU microseconds (user and system,
from /proc). Wall-clock req/s is printed but only the counts per request are
comparable on a shared box. Needs perf with the syscalls tracepoints (root).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import benchlib as B

EVENTS = ["syscalls:sys_enter_epoll_wait", "syscalls:sys_enter_epoll_pwait",
          "syscalls:sys_enter_read", "syscalls:sys_enter_recvfrom",
          "syscalls:sys_enter_write", "syscalls:sys_enter_sendto", "syscalls:sys_enter_writev",
          "syscalls:sys_enter_epoll_ctl", "syscalls:sys_enter_futex", "context-switches"]
COLUMNS = {"epoll_wait": ("epoll_wait", "epoll_pwait"), "read": ("read", "recvfrom"),
           "write": ("write", "sendto", "writev"), "epoll_ctl": ("epoll_ctl",),
           "futex": ("futex",), "ctx switches": ("context-switches",)}


def start(procs: B.Procs, tmp: str, label: str, argv: list[str], workers: int, c_ref: bool):
    port = B.free_port()
    log = os.path.join(tmp, f"{label}.log")
    out = os.path.join(tmp, f"{label}.out")
    with open(out, "wb") as f:
        p = procs.start([a.replace("PORT", str(port)) for a in argv], log_path=log, stdout=f,
                        cwd=B.APPS)
    if c_ref:
        B.wait_for(lambda: "ready" in B.read_text(out), 30, f"{label} ready")
    else:
        B.wait_sockherd_ready(p, log, workers)
    B.wait_for(lambda: B.can_connect(port), 30, f"{label} answering")
    # the processes that serve: the C reference's children, sockherd's workers
    pids = [pid for pid in B.tree(p.pid) if pid != p.pid] or [p.pid]
    return p, port, pids


def measure(port: int, pids: list[int], a) -> dict:
    """perf stat over the pids while wrk runs; counts and CPU of the window."""
    ut0 = {pid: _utime_stime(pid) for pid in pids}
    perf = subprocess.Popen(["perf", "stat", "-x", ",", "-e", ",".join(EVENTS),
                             "-p", ",".join(map(str, pids))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.2)                        # perf attached (its counts start at its start)
    wrk = subprocess.run(["wrk", "-t1", f"-c{a.conns}", f"-d{a.seconds}s",
                          f"http://127.0.0.1:{port}/"], capture_output=True, text=True,
                         timeout=a.seconds + 60)
    perf.send_signal(2)
    _, err = perf.communicate(timeout=30)
    m = re.search(r"(\d+) requests in ([\d.]+)s", wrk.stdout)
    if not m or wrk.returncode != 0:
        raise B.BenchError(f"wrk failed: {wrk.stdout} {wrk.stderr}")
    counts = {}
    for line in err.splitlines():
        f = line.split(",")
        if len(f) > 2 and f[0].strip().isdigit():
            counts[f[2].split(":")[-1].replace("sys_enter_", "")] = int(f[0])
    ut1 = {pid: _utime_stime(pid) for pid in pids}
    user = sum(ut1[p][0] - ut0[p][0] for p in pids) / B.CLK_TCK
    system = sum(ut1[p][1] - ut0[p][1] for p in pids) / B.CLK_TCK
    return {"requests": int(m.group(1)), "seconds": float(m.group(2)), "counts": counts,
            "user": user, "sys": system}


def _utime_stime(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    st = s[s.rindex(")") + 2:].split()
    return int(st[11]), int(st[12])


def main() -> int:
    ap = B.arg_parser(__doc__)
    ap.add_argument("--checkout", action="append", help="a checkout with its .venv (repeatable)")
    ap.add_argument("--c-ref", action="store_true", help="also bench/c_http_ref.c")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--conns", type=int, default=50)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    servers = []
    for d in a.checkout or ["."]:
        d = os.path.abspath(d)
        servers.append((os.path.basename(d) + "@" + _head(d), False,
                        [os.path.join(d, ".venv", "bin", "sockherd"), "run", "hello:app",
                         "-w", str(a.workers), "--threads", str(a.threads), "-b", "127.0.0.1:PORT",
                         "--pythonpath", B.APPS]))
    if a.c_ref:
        servers.append(("c-ref", True, [B.build_c("c_http_ref"), "PORT", str(a.workers)]))
    print(B.header("hello_syscalls: syscalls, sleeps and CPU per WSGI hello request"))
    print(f"- wrk -t1 -c{a.conns} -d{a.seconds}s keep-alive; sockherd -w {a.workers} "
          f"-t {a.threads}; {a.rounds} round(s), servers alternated\n")
    rows = []
    with B.Procs() as procs, B.tempdir("hello-syscalls-") as tmp:
        for r in range(a.rounds):
            for label, c_ref, argv in servers:
                load = os.getloadavg()[0]
                p, port, pids = start(procs, tmp, f"{label}-{r}", argv, a.workers, c_ref)
                try:
                    res = measure(port, pids, a)
                finally:
                    procs.stop(p, timeout=30)
                n = res["requests"]
                cols = [sum(res["counts"].get(k, 0) for k in keys) / n
                        for keys in COLUMNS.values()]
                rows.append([r + 1, label, f"{n / res['seconds']:,.0f}", f"{load:.1f}",
                             *[f"{c:.3f}" for c in cols],
                             f"{res['user'] / n * 1e6:.2f}", f"{res['sys'] / n * 1e6:.2f}",
                             f"{n / max(res['user'] + res['sys'], 1e-9):,.0f}"])
                print(f"# {rows[-1]}", file=sys.stderr, flush=True)
    print(B.table(["round", "server", "req/s", "load avg", *[f"{c}/req" for c in COLUMNS],
                   "user µs/req", "sys µs/req", "req per CPU-s"], rows))
    print(B.footer())
    return 0


def _head(d: str) -> str:
    try:
        head = subprocess.run(["git", "-C", d, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", d, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("+" if dirty else "")
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
