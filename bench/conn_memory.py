"""Memory per idle kept-alive HTTP connection (issue 8 section 7, aim <= 4 KiB).

Starts `sockherd run hello:app -w 1` (bench/apps/hello.py), opens N
keep-alive connections, sends one GET on each and reads the answer, then
reads the worker's VmRSS: (after - before) / N, where "before" is taken
after a warm-up of 200 connections (imports, first allocations).

    .venv/bin/python bench/conn_memory.py [-n 5000] [--p99]

--p99 also runs wrk (bench/setup_peers.sh installs it) against the worker
with 200 and then N + 200 idle connections open.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOCKHERD = HERE.parent / ".venv" / "bin" / "sockherd"


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def wait_for(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := fn()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)
    return value


def wrk_latency(port: int) -> dict[str, str]:
    out = subprocess.run(["wrk", "-t1", "-c10", "-d5s", "--latency",
                          f"http://127.0.0.1:{port}/"], capture_output=True, text=True,
                         timeout=60).stdout
    got = {"rps": re.search(r"Requests/sec:\s+(\S+)", out).group(1)}
    for pct in ("50%", "99%"):
        got[pct] = re.search(rf"^\s+{pct}\s+(\S+)", out, re.M).group(1)
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=5000, help="idle connections (5000)")
    ap.add_argument("--p99", action="store_true",
                    help="also: wrk -c10 for 5 s against the same worker before and after the "
                         "idle connections are open (does an active client's p99 stay flat?)")
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.n + 1000, args.n + 1000))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    master = subprocess.Popen([str(SOCKHERD), "run", "hello:app", "-w", "1", "--pythonpath",
                               str(HERE / "apps"), "-b", f"127.0.0.1:{port}",
                               "--max-connections", str(args.n + 1000)],
                              stderr=subprocess.DEVNULL)
    conns: list[socket.socket] = []
    try:
        def connect():
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                return None

        wait_for(lambda: (c := connect()) and (c.close() or True), 30, "the server")
        worker = int(wait_for(lambda: open(f"/proc/{master.pid}/task/{master.pid}/children")
                              .read().split(), 30, "the worker")[0])

        def one() -> socket.socket:
            c = socket.create_connection(("127.0.0.1", port), timeout=10)
            c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            assert c.recv(4096).startswith(b"HTTP/1.1 200")
            return c

        conns += [one() for _ in range(200)]
        lat_before = wrk_latency(port) if args.p99 else None
        before = rss_kib(worker)
        conns += [one() for _ in range(args.n)]
        time.sleep(0.5)                     # the measuring point settles (not a wait)
        after = rss_kib(worker)
        lat_after = wrk_latency(port) if args.p99 else None
        per = (after - before) * 1024 / args.n
        print(f"| idle keep-alive connections | worker RSS before | after | bytes per connection |")
        print(f"|---|---|---|---|")
        print(f"| {args.n} | {before} KiB | {after} KiB | {per:.0f} |")
        if args.p99:
            print()
            print("| wrk -t1 -c10 -d5s, one worker | req/s | p50 | p99 |")
            print("|---|---|---|---|")
            for label, lat in (("200 idle connections open", lat_before),
                               (f"{args.n + 200} idle connections open", lat_after)):
                print(f"| {label} | {lat['rps']} | {lat['50%']} | {lat['99%']} |")
    finally:
        for c in conns:
            c.close()
        master.send_signal(signal.SIGINT)
        try:
            master.wait(30)
        except subprocess.TimeoutExpired:
            master.kill()
            master.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
