#!/usr/bin/env python3
"""echo_bench: stream echo throughput of `sockherd run` against asyncio+uvloop,
in the same run.

    .venv/bin/python bench/echo_bench.py [--seconds 10] [--conns 100] [--size 64]

Servers (each started, measured, stopped with SIGTERM):

  sockherd -w 2 -t 1   `sockherd run echo:Echo --interface stream -w 2 -t 1`
  sockherd -w 2 -t 2   the same with 2 loop threads per worker
  uvloop 2 procs       bench/uvloop_echo.py (bench/.venv-peers/bin/python): bind,
                       fork 2 processes, each a uvloop loop with an echo Protocol
                       on the shared listener

The client is bench/echo_pingpong.c (gcc -O2, built into bench/build/): one
thread, --conns connections; each sends --size bytes, waits for the same bytes
back (checked), and sends again. The first --warmup seconds are not counted.
Client, server and the 2 cores are shared: the figure is what the whole box
does, the same for every server. Reported: round trips (messages) per second,
the ratio to uvloop of the same round, the server tree's CPU seconds and
messages per server CPU-second, the fewest/most round trips of one
connection, connections per process, and any lost connection or mismatch.

"client CPU" is the C client's CPU time per second of the window, "box busy"
the whole machine's busy cores over it (/proc/stat; 2.00 = both cores), with
in brackets the part /proc/stat books as irq + softirq (loopback TCP
processing; the kernel may also charge some of it to the process it
interrupted). Box busy well above server + client + irq means other processes
took the cores (the machine may be shared): compare such rows with care.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

import benchlib as B


def client_run(client: str, port: int, a) -> dict:
    return B.run_json_client([client, "127.0.0.1", str(port), str(a.conns), str(a.seconds),
                              str(a.size), str(a.warmup)], timeout=a.seconds + a.warmup + 60)


def measure(p, client: str, port: int, a) -> dict:
    s0 = B.tree_sample(p.pid)
    t0 = time.monotonic()
    with B.BoxMeter() as box:
        res = client_run(client, port, a)
    res["box"], res["client_cpu"] = box.busy_cores, box.children_cpu / box.seconds
    res["irq"] = box.irq_cores
    s1 = B.tree_sample(p.pid)
    res["cpu_s"] = B.tree_delta(s0, s1, time.monotonic() - t0)["cpu_s"]
    res["cpu_window"] = time.monotonic() - t0
    return res


def run_sockherd(procs: B.Procs, tmp: str, client: str, a, threads: int) -> dict:
    port = B.free_port()
    log = os.path.join(tmp, f"sockherd-t{threads}.log")
    p = procs.start(B.sockherd_argv("echo:Echo", port, workers=a.workers, threads=threads),
                    log_path=log)
    pids = B.wait_sockherd_ready(p, log, a.workers)
    res = measure(p, client, port, a)
    rc = procs.stop(p, timeout=30)
    text = B.read_text(log)
    if rc != 0:
        raise B.BenchError(f"sockherd exited with {rc} after SIGTERM:\n{text[-3000:]}")
    totals = B.parse_totals(text)
    warn = re.findall(r"(?:WARNING|ERROR) (.*)", text)
    res.update(server=f"sockherd -w {a.workers} -t {threads}",
               per_proc=[totals.get(pid, {}).get("accepted", "?") for pid in pids],
               notes="; ".join(warn[:3]))
    return res


def run_uvloop(procs: B.Procs, tmp: str, client: str, a) -> dict:
    port = B.free_port()
    log = os.path.join(tmp, "uvloop.log")
    out = os.path.join(tmp, "uvloop.out")
    with open(out, "wb") as f:
        p = procs.start([B.PEERS_PY, os.path.join(B.HERE, "uvloop_echo.py"), "--port", str(port),
                         "--procs", str(a.workers)], log_path=log, stdout=f)
    B.wait_for(lambda: "ready" in B.read_text(out) or p.poll() is not None, 30, "uvloop ready")
    if p.poll() is not None:
        raise B.BenchError(f"uvloop_echo exited {p.returncode}: {B.read_text(log)}")
    res = measure(p, client, port, a)
    rc = procs.stop(p, timeout=30)
    if rc != 0:
        raise B.BenchError(f"uvloop_echo exited {rc}: {B.read_text(log)}")
    kids = re.findall(r"child (\d+) connections=(\d+)", B.read_text(out))
    res.update(server=f"uvloop {a.workers} procs", per_proc=[int(k[1]) for k in kids],
               notes=B.read_text(log).strip()[:200])
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds (10)")
    ap.add_argument("--warmup", type=float, default=1.0, help="uncounted seconds first (1)")
    ap.add_argument("--conns", type=int, default=100, help="connections (100)")
    ap.add_argument("--size", type=int, default=64, help="message bytes (64)")
    ap.add_argument("-w", "--workers", type=int, default=2,
                    help="sockherd workers and uvloop processes (2)")
    ap.add_argument("--threads", default="1,2", help="sockherd -t values, one row each (1,2)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="repeat every server this many times, interleaved (2)")
    ap.add_argument("--no-uvloop", action="store_true", help="sockherd rows only")
    a = ap.parse_args()
    B.check_sockherd()
    if not a.no_uvloop:
        B.check_peers_venv()
    client = B.build_c("echo_pingpong")
    results = []
    with B.Procs() as procs, B.tempdir("echo_bench-") as tmp:
        head = B.header("echo_bench: stream echo ping-pong")
        for rnd in range(a.rounds):
            plan = [("sockherd", int(t)) for t in a.threads.split(",") if t.strip()]
            if not a.no_uvloop:
                plan.append(("uvloop", 0))
            for kind, threads in plan:
                print(f"# round {rnd + 1}: {kind} {threads or ''}", file=sys.stderr, flush=True)
                if kind == "sockherd":
                    r = run_sockherd(procs, tmp, client, a, threads)
                else:
                    r = run_uvloop(procs, tmp, client, a)
                r["round"] = rnd + 1
                results.append(r)
                print(f"#   {r}", file=sys.stderr, flush=True)
    base = {r["round"]: r for r in results if r["server"].startswith("uvloop")}
    rows = []
    for r in results:
        b = base.get(r["round"])
        lost = r["eof"] + r["reset"] + r["other"]
        rows.append([r["round"], r["server"], f"{r['rate']:,.0f}",
                     f"{r['rate'] / b['rate']:.2f}" if b else "-",
                     f"{r['cpu_s'] / r['cpu_window']:.2f}",
                     f"{r['rate'] * r['cpu_window'] / max(r['cpu_s'], 1e-9):,.0f}",
                     f"{r['client_cpu']:.2f}", f"{r['box']:.2f} ({r['irq']:.2f})",
                     f"{r['min_conn']:,}/{r['max_conn']:,}",
                     "/".join(str(x) for x in r["per_proc"]),
                     f"{lost} lost, {r['mismatch']} mismatched, {r['stalled']} stalled"])
    print(head)
    print(f"- client: bench/echo_pingpong.c, 1 thread, {a.conns} connections, {a.size}-byte "
          f"messages, ping-pong, {a.warmup:g} s warm-up then {a.seconds:g} s counted\n")
    print(B.table(["round", "server", "msgs/s", "vs uvloop", "server CPU (cores)",
                   "msgs per server CPU-s", "client CPU (cores)",
                   "box busy (irq+softirq) (cores)", "per conn min/max", "conns per process",
                   "errors"], rows))
    sums: dict[str, list[float]] = {}
    for r in results:
        sums.setdefault(r["server"], []).append(r["rate"])
    if len(sums) > 1 and base:
        ub = sum(b["rate"] for b in base.values()) / len(base)
        print()
        for name, rates in sums.items():
            mean = sum(rates) / len(rates)
            print(f"- mean over {len(rates)} round(s): {name}: {mean:,.0f} msgs/s, "
                  f"{mean / ub:.2f} x uvloop")
    for r in results:
        if r["notes"]:
            print(f"- round {r['round']} {r['server']} log: {r['notes']}")
    print(B.footer())
    return 0


if __name__ == "__main__":
    sys.exit(main())
