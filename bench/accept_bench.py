#!/usr/bin/env python3
"""accept_bench: accept efficiency of `sockherd run` under a connection flood,
against the classic prefork server in the same run.

    .venv/bin/python bench/accept_bench.py [--seconds 10] [--inflight 64]

Servers (each started, flooded for --seconds, then stopped with SIGTERM):

  sockherd          `sockherd run echo:CloseOnConnect --interface stream -w 2 --threads 4
                    --thread-groups 2` (one listener; each worker inserts it once per
                    thread group, EPOLLEXCLUSIVE); the app closes every connection in
                    on_connect. Counters: the workers' `totals:` lines at exit.
  prefork-epoll     bench/prefork_server.py --mode epoll: 8 processes forked after
                    bind, each a level-triggered (not exclusive) epoll on the shared
                    non-blocking listener, accept until EAGAIN (thundering herd)
  prefork-blocking  bench/prefork_server.py --mode blocking: 8 processes in accept()

The client is bench/accept_flood.c (gcc -O2, built into bench/build/): one
thread keeping --inflight non-blocking connects in flight; each connection
waits for the server's close (EOF), closes, and is replaced. Connections are
spread over --nsrc source addresses 127.0.0.2... so ports are reused less.

Reported per server: completed connections per second (client side), the
server's accepted count, accept_empty (a listener wake-up whose first accept()
found nothing) per accepted, wake-ups per accepted as the server counts them
(sockherd: poll loops of the loop threads; prefork: epoll_wait/select returns
with the listener ready), context switches per accepted (voluntary +
nonvoluntary, every thread of the server tree, from /proc: the kernel-level
wake-ups, which include a herd's waiters that the kernel puts back to sleep
without returning to user space), the server tree's CPU seconds and
accepts per server CPU-second, and failures. Ratios are against sockherd.

"client CPU" is the C client's CPU time per second of the window, "box busy"
the whole machine's busy cores over it (/proc/stat; 2.00 = both cores), with
in brackets the part /proc/stat books as irq + softirq (loopback TCP
processing; the kernel may also charge some of it to the process it
interrupted). Box busy well above server + client + irq means other processes
took the cores (the machine may be shared): compare such rows with care.
"""
from __future__ import annotations

import os
import re
import sys
import time

import benchlib as B


def flood(client: str, port: int, a) -> dict:
    return B.run_json_client([client, "127.0.0.1", str(port), str(a.cur_seconds),
                              str(a.cur_inflight), str(a.nsrc)], timeout=a.cur_seconds + 60)


def measured_flood(pid: int, client: str, port: int, a) -> dict:
    """flood() with the server's process tree (pid) measured over it: its
    CPU seconds and context switches, the box's busy cores, the client's
    CPU, the interrupts' share."""
    s0 = B.tree_sample(pid)
    t0 = time.monotonic()
    with B.BoxMeter() as box:
        res = flood(client, port, a)
    cpu = B.tree_delta(s0, B.tree_sample(pid), time.monotonic() - t0)
    res["box"], res["client_cpu"] = box.busy_cores, box.children_cpu / box.seconds
    res["irq"] = box.irq_cores
    res["ctxsw"], res["cpu_s"] = cpu["wake"], cpu["cpu_s"]
    return res


def run_sockherd(procs: B.Procs, tmp: str, client: str, a) -> dict:
    port = B.free_port()
    log = os.path.join(tmp, "sockherd.log")
    p = procs.start(B.sockherd_argv("echo:CloseOnConnect", port, workers=a.workers,
                                    threads=a.threads, groups=a.groups), log_path=log)
    pids = B.wait_sockherd_ready(p, log, a.workers)
    res = measured_flood(p.pid, client, port, a)
    rc = procs.stop(p, timeout=30)
    text = B.read_text(log)
    if rc != 0:
        raise B.BenchError(f"sockherd exited with {rc} after SIGTERM:\n{text[-3000:]}")
    totals = B.parse_totals(text)
    if set(totals) != set(pids):
        raise B.BenchError(f"expected a totals line from workers {pids}, got {sorted(totals)}:"
                           f"\n{text[-3000:]}")
    acc = sum(t["accepted"] for t in totals.values())
    empty = sum(t["accept_empty"] for t in totals.values())
    loops = sum(t["loops"] for t in totals.values())
    exits = re.findall(r"worker \d+\.\d+: exited with (.*?), pid", text)
    res.update(server="sockherd", accepted=acc, accept_empty=empty, wakeups=loops,
               per_worker=[totals[pid]["accepted"] for pid in pids],
               detail="; ".join(f"pid {pid}: " + " ".join(f"{k}={v}" for k, v in totals[pid].items())
                                for pid in pids) + f"; exits: {', '.join(exits)}")
    return res


def run_prefork(procs: B.Procs, tmp: str, client: str, a, mode: str) -> dict:
    port = B.free_port()
    log = os.path.join(tmp, f"prefork-{mode}.log")
    out = os.path.join(tmp, f"prefork-{mode}.out")
    with open(out, "wb") as f:
        p = procs.start([sys.executable, os.path.join(B.HERE, "prefork_server.py"), "--port",
                         str(port), "--procs", str(a.procs), "--mode", mode], log_path=log,
                        stdout=f)
    B.wait_for(lambda: "ready" in B.read_text(out) or p.poll() is not None, 30,
               f"prefork-{mode} ready")
    if p.poll() is not None:
        raise B.BenchError(f"prefork-{mode} exited {p.returncode}: {B.read_text(log)}")
    res = measured_flood(p.pid, client, port, a)
    rc = procs.stop(p, timeout=30)
    if rc != 0:
        raise B.BenchError(f"prefork-{mode} exited {rc}: {B.read_text(log)}")
    kids = re.findall(r"child (\d+) accepted=(\d+) accept_empty=(\d+) wakeups=(\d+)",
                      B.read_text(out))
    if len(kids) != a.procs:
        raise B.BenchError(f"prefork-{mode}: {len(kids)} child reports of {a.procs}: "
                           f"{B.read_text(out)} {B.read_text(log)}")
    res.update(server=f"prefork-{mode} ({a.procs} procs)",
               accepted=sum(int(k[1]) for k in kids), accept_empty=sum(int(k[2]) for k in kids),
               wakeups=sum(int(k[3]) for k in kids),
               per_worker=[int(k[1]) for k in kids], detail="")
    return res


def main() -> int:
    ap = B.arg_parser(__doc__)
    ap.add_argument("--seconds", type=float, default=10.0, help="flood length per server (10)")
    ap.add_argument("--inflight", type=int, default=64, help="connects in flight (64)")
    ap.add_argument("--nsrc", type=int, default=16,
                    help="source addresses 127.0.0.2.. the client spreads over (16)")
    ap.add_argument("-w", "--workers", type=int, default=2, help="sockherd workers (2)")
    ap.add_argument("--threads", "--threads", type=int, default=4, help="sockherd threads (4)")
    ap.add_argument("--groups", type=int, default=2, help="sockherd thread groups (2)")
    ap.add_argument("--procs", type=int, default=8, help="prefork processes (8)")
    ap.add_argument("--servers", default="sockherd,prefork-epoll,prefork-blocking",
                    help="comma-separated subset of sockherd,prefork-epoll,prefork-select,"
                         "prefork-blocking (default: all but select)")
    ap.add_argument("--light-seconds", type=float, default=5.0,
                    help="then a light-load round: 1 connection in flight for this long per "
                         "server, where the thundering herd shows most (5; 0: none)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="repeat the whole list this many times, interleaved (2)")
    a = ap.parse_args()
    B.check_sockherd()
    client = B.build_c("accept_flood")
    servers = [s.strip() for s in a.servers.split(",") if s.strip()]
    results = []
    with B.Procs() as procs, B.tempdir("accept_bench-") as tmp:
        head = B.header("accept_bench: connection flood, server closes on connect")
        plan = [(rnd + 1, "flood", a.seconds, a.inflight) for rnd in range(a.rounds)]
        if a.light_seconds > 0:
            plan.append((a.rounds + 1, "light", a.light_seconds, 1))
        for rnd, load, secs, inflight in plan:
            a.cur_seconds, a.cur_inflight = secs, inflight
            for name in servers:
                print(f"# round {rnd} ({load}): {name} ...", file=sys.stderr, flush=True)
                if name == "sockherd":
                    r = run_sockherd(procs, tmp, client, a)
                elif name.startswith("prefork-"):
                    r = run_prefork(procs, tmp, client, a, name.split("-", 1)[1])
                else:
                    raise SystemExit(f"unknown server {name}")
                r["round"] = rnd
                r["load"] = f"{load} ({inflight} in flight)"
                results.append(r)
                print(f"#   {r}", file=sys.stderr, flush=True)
    ref = {r["round"]: r for r in results if r["server"] == "sockherd"}
    rows = []
    for r in results:
        acc = max(r["accepted"], 1)
        base = ref.get(r["round"])
        ratio = f"{r['rate'] / base['rate']:.2f}" if base else "-"
        fails = r["refused"] + r["reset"] + r["timeout"] + r["other"]
        rows.append([r["round"], r["load"], r["server"], f"{r['rate']:,.0f}", ratio, f"{r['accepted']:,}",
                     f"{r['accept_empty'] / acc:.4f}", f"{r['wakeups'] / acc:.3f}",
                     f"{r['ctxsw'] / acc:.2f}",
                     f"{r['cpu_s']:.2f}", f"{r['accepted'] / max(r['cpu_s'], 1e-9):,.0f}",
                     f"{r['client_cpu']:.2f}", f"{r['box']:.2f} ({r['irq']:.2f})",
                     f"{fails} ({r['refused']}/{r['reset']}/{r['timeout']}/{r['other']})",
                     r["inflight_end"], f"{r['max_ms']:.0f}",
                     "/".join(str(x) for x in r["per_worker"])])
    print(head)
    print(f"- flood: {a.seconds:g} s per server, {a.inflight} connects in flight, "
          f"{a.nsrc} source addresses, 1 client thread (bench/accept_flood.c); light load: "
          f"{a.light_seconds:g} s, 1 connect in flight")
    print(f"- sockherd: -w {a.workers} --threads {a.threads} --thread-groups {a.groups}, app "
          f"echo:CloseOnConnect; prefork: {a.procs} processes\n")
    print(B.table(["round", "load", "server", "conns/s", "vs sockherd", "accepted", "empty/accepted",
                   "wake-ups/accepted", "ctx switches/accepted", "server CPU s", "accepts/CPU-s",
                   "client CPU (cores)", "box busy (irq+softirq) (cores)",
                   "failed (refused/reset/timeout/other)", "in flight at end", "max ms",
                   "accepted per process"], rows))
    means: dict[str, list[dict]] = {}
    for r in results:
        if r["load"].startswith("flood"):
            means.setdefault(r["server"], []).append(r)
    sh = means.get("sockherd")
    if len(means) > 1 or a.rounds > 1:
        print()
        for name, rs in means.items():
            rate = sum(r["rate"] for r in rs) / len(rs)
            empty = sum(r["accept_empty"] for r in rs) / max(sum(r["accepted"] for r in rs), 1)
            vs = ""
            if sh:
                sh_rate = sum(r["rate"] for r in sh) / len(sh)
                vs = f" = {rate / sh_rate:.2f} x sockherd"
            print(f"- flood, mean over {len(rs)} round(s): {name}: {rate:,.0f} conns/s{vs}, "
                  f"empty/accepted {empty:.4f}")
    details = [r for r in results if r["detail"]]
    if details:
        print()
        for r in details:
            print(f"- round {r['round']} {r['load']} {r['server']} totals: {r['detail']}")
    print(B.footer())
    return 0


if __name__ == "__main__":
    sys.exit(main())
