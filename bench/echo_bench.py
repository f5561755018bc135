#!/usr/bin/env python3
"""echo_bench: stream echo of `sockherd run` against an asyncio, a uvloop and
a C echo server, in the same run (issue 7; issue 20's before/after).

    .venv/bin/python bench/echo_bench.py [--rounds 2] [--seconds 8]
        [--only sockherd,asyncio,uvloop,c] [--loads small,bulk] [--threads 1]

Servers, 2 processes each (-w), started once per round, measured under
every load, stopped with SIGTERM; the order is the same in every round:

  sockherd -w 2 -t T  `sockherd run echo:Echo --interface stream -w 2 -t T`
                      (bench/apps/echo.py: on_data writes back what came)
  asyncio 2 procs     bench/asyncio_echo.py --loop asyncio: 2 processes, each
                      its own SO_REUSEPORT listener, asyncio's selector loop,
                      an echo Protocol (bench/.venv-peers/bin/python)
  uvloop 2 procs      the same with --loop uvloop
  c 2 procs           bench/c_echo_ref.c (gcc -O2 into bench/build/): 2
                      processes, each its own SO_REUSEPORT listener and epoll

Loads (client: bench/echo_pingpong.c, gcc -O2 into bench/build/; each
connection sends a message, waits until the same bytes came back, checks
them, and sends the next one; --warmup s not counted, then --seconds):

  small   --small-conns (50) connections, --small-size (64) byte messages
  bulk    --bulk-conns (8) connections, --bulk-size (65536) byte messages

Reported per row: round trips (messages) per second and MiB/s echoed (one
way), the ratios to uvloop, asyncio and C of the same round, the server
tree's CPU (utime + stime of every process from /proc, before/after the
window), server CPU microseconds per message and messages per server
CPU-second, connections per process (over the server's life in that round,
its own count), any lost connection or mismatched byte.

The 2 cores are shared by client and server (and, on this machine, other
engineers): msgs/s is what the box does with both on it, the server's CPU per
message is the steadier figure. "client" is the client's CPU over the counted
window (cores; "/thread" per client thread: near 1.00 means the client was
the limit, not the server); "box" the whole machine's busy cores (/proc/stat)
and "irq" its irq + softirq part (loopback TCP processing; the kernel may
also charge some of it to the process it interrupted); "other" = box -
server - client - irq, what other processes took: a row with other > 0.3
cores is flagged as disturbed.
"""
from __future__ import annotations

import os
import re
import sys
import time

import benchlib as B

PEERS = ("asyncio", "uvloop", "c")


def wait_quiet_row(limit: float) -> float:
    """Waits (at most limit s, in 1 s looks) for the box to be below 0.3 busy
    cores: our servers are idle between rows, so what is busy is others'
    work. The seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit and B.busy_now() >= 0.3:
        pass
    return time.monotonic() - t0


def measure(p, client: str, port: int, a, load: str) -> dict:
    waited = wait_quiet_row(a.row_wait) if a.row_wait > 0 else 0.0
    conns, size = (a.small_conns, a.small_size) if load == "small" else (a.bulk_conns,
                                                                          a.bulk_size)
    s0 = B.tree_sample(p.pid)
    t0 = time.monotonic()
    with B.BoxMeter() as box:
        res = B.run_json_client([client, "127.0.0.1", str(port), str(conns), str(a.seconds),
                                 str(size), str(a.warmup), str(a.client_threads)],
                                timeout=a.seconds + a.warmup + 60)
    window = time.monotonic() - t0
    s1 = B.tree_sample(p.pid)
    res["other_err"] = res.pop("other")     # the client's count of other errors
    res["cpu_s"] = B.tree_delta(s0, s1, window)["cpu_s"]
    res["window"] = window
    res["box"], res["irq"] = box.busy_cores, box.irq_cores
    res["client_cores"] = res["cpu"] / res["seconds"]
    # the server's CPU is taken over the whole client run (warm-up and
    # connects included): its rate per second of that window
    res["server_cores"] = res["cpu_s"] / window
    res["other"] = max(0.0, res["box"] - res["server_cores"] - res["client_cores"] - res["irq"])
    res["load"], res["conns"], res["size"], res["waited"] = load, conns, size, waited
    res["loadavg"] = os.getloadavg()[0]
    # messages in the window per server CPU-second: the CPU over the whole
    # run scaled to the counted window
    cpu_counted = res["cpu_s"] * res["seconds"] / window
    res["us_per_msg"] = cpu_counted / max(res["msgs"], 1) * 1e6
    return res


def start_sockherd(procs: B.Procs, tmp: str, a, threads: int, rnd: int):
    port = B.free_port()
    log = os.path.join(tmp, f"sockherd-t{threads}-r{rnd}.log")
    p = procs.start(B.sockherd_argv("echo:Echo", port, workers=a.workers, threads=threads),
                    log_path=log)
    B.wait_sockherd_ready(p, log, a.workers)

    def finish() -> dict:
        rc = procs.stop(p, timeout=30)
        text = B.read_text(log)
        if rc != 0:
            raise B.BenchError(f"sockherd exited with {rc} after SIGTERM:\n{text[-3000:]}")
        totals = B.parse_totals(text)
        warn = re.findall(r"(?:WARNING|ERROR) (.*)", text)
        return {"per_proc": [t.get("accepted", "?") for t in totals.values()],
                "notes": "; ".join(warn[:3])}
    return p, port, finish


def start_peer(procs: B.Procs, tmp: str, a, kind: str, rnd: int):
    port = B.free_port()
    log = os.path.join(tmp, f"{kind}-r{rnd}.log")
    out = os.path.join(tmp, f"{kind}-r{rnd}.out")
    if kind == "c":
        argv = [B.build_c("c_echo_ref"), str(port), str(a.workers)]
    else:
        argv = [B.PEERS_PY, os.path.join(B.HERE, "asyncio_echo.py"), "--port", str(port),
                "--procs", str(a.workers), "--loop", kind]
    with open(out, "wb") as f:
        p = procs.start(argv, log_path=log, stdout=f)
    B.wait_for(lambda: "ready" in B.read_text(out) or p.poll() is not None, 30, f"{kind} ready")
    if p.poll() is not None:
        raise B.BenchError(f"{kind} echo server exited {p.returncode}: {B.read_text(log)}")

    def finish() -> dict:
        rc = procs.stop(p, timeout=30)
        if rc != 0:
            raise B.BenchError(f"{kind} echo server exited {rc}: {B.read_text(log)}")
        kids = re.findall(r"child (\d+) connections=(\d+)", B.read_text(out))
        return {"per_proc": [int(k[1]) for k in kids], "notes": B.read_text(log).strip()[:200]}
    return p, port, finish


def server_name(kind: str, a, threads: int = 0) -> str:
    if kind == "sockherd":
        return f"sockherd -w {a.workers} --threads {threads}"
    return f"{kind} {a.workers} procs"


def ratio(x: float, base: float | None) -> str:
    return f"{x / base:.2f}" if base else "-"


def report(results: list[dict], a, head: str) -> None:
    print(head)
    print(f"- client: bench/echo_pingpong.c, {a.client_threads} thread(s), ping-pong (one "
          f"message in flight per connection, echo checked), {a.warmup:g} s warm-up then "
          f"{a.seconds:g} s counted; servers {a.workers} processes each; peers' Python "
          f"from bench/.venv-peers ({peer_versions()})")
    for load in a.loads:
        rows_l = [r for r in results if r["load"] == load]
        if not rows_l:
            continue
        r0 = rows_l[0]
        print(f"\n#### {load}: {r0['conns']} connections, {r0['size']:,}-byte messages\n")
        base = {(r["round"], r["kind"]): r for r in rows_l}
        rows = []
        for r in rows_l:
            s, u, c = (base.get((r["round"], k)) for k in PEERS)
            lost = r["eof"] + r["reset"] + r["other_err"]
            flag = " **disturbed**" if r["other"] > 0.3 else ""
            rows.append([r["round"], r["server"], f"{r['rate']:,.0f}",
                         f"{r['rate'] * r['size'] / 2**20:,.1f}",
                         ratio(r["rate"], s and s["rate"]), ratio(r["rate"], u and u["rate"]),
                         ratio(r["rate"], c and c["rate"]),
                         f"{r['server_cores']:.2f}", f"{r['us_per_msg']:.1f}",
                         f"{1e6 / max(r['us_per_msg'], 1e-9):,.0f}",
                         f"{r['client_cores']:.2f} / {r['client_cores'] / r['threads']:.2f}",
                         f"{r['box']:.2f}", f"{r['irq']:.2f}", f"{r['other']:.2f}{flag}",
                         f"{r['loadavg']:.1f}"
                         + (f" (waited {r['waited']:.0f} s)" if r["waited"] >= 1 else ""),
                         f"{r['min_conn']:,}/{r['max_conn']:,}",
                         "/".join(str(x) for x in r["per_proc"]),
                         f"{lost} lost, {r['mismatch']} mismatched, {r['stalled']} stalled"])
        print(B.table(["round", "server", "msgs/s", "MiB/s", "vs asyncio", "vs uvloop", "vs c",
                       "server cores", "server CPU µs/msg", "msgs per server CPU-s",
                       "client cores / per thread", "box", "irq", "other", "load avg 1 min",
                       "per conn min/max", "conns per process", "errors"],
                      rows))
        # means over the rounds, each server against the peers' means
        means: dict[str, dict] = {}
        for r in rows_l:
            m = means.setdefault(r["server"], {"kind": r["kind"], "rate": [], "us": []})
            m["rate"].append(r["rate"])
            m["us"].append(r["us_per_msg"])
        avg = {n: (sum(m["rate"]) / len(m["rate"]), sum(m["us"]) / len(m["us"]))
               for n, m in means.items()}
        peer_avg = {means[n]["kind"]: v for n, v in avg.items() if means[n]["kind"] in PEERS}
        print()
        for n, (rate, us) in avg.items():
            parts = [f"{rate:,.0f} msgs/s, {us:.1f} server CPU µs/msg"]
            for k in PEERS:
                if k in peer_avg and means[n]["kind"] != k:
                    pr, pu = peer_avg[k]
                    parts.append(f"{rate / pr:.2f}x {k}'s msgs/s, {us / pu:.2f}x its CPU/msg")
            print(f"- {load}, mean of {len(means[n]['rate'])} round(s), {n}: " + "; ".join(parts))
    for r in results:
        if r.get("notes"):
            print(f"- round {r['round']} {r['server']} log: {r['notes']}")
    print(B.footer())


def peer_versions() -> str:
    import subprocess
    if not os.path.exists(B.PEERS_PY):
        return "absent"
    r = subprocess.run([B.PEERS_PY, "-c", "import platform, importlib.metadata as m; "
                        "print('Python', platform.python_version(), 'uvloop', "
                        "m.version('uvloop'))"], capture_output=True, text=True, timeout=30)
    return r.stdout.strip() or r.stderr.strip()[-200:]


def main() -> int:
    ap = B.arg_parser(__doc__)
    ap.add_argument("--seconds", type=float, default=8.0, help="counted seconds per row (8)")
    ap.add_argument("--warmup", type=float, default=1.0, help="uncounted seconds first (1)")
    ap.add_argument("--loads", default="small,bulk", help="small and/or bulk (both)")
    ap.add_argument("--small-conns", type=int, default=50)
    ap.add_argument("--small-size", type=int, default=64)
    ap.add_argument("--bulk-conns", type=int, default=8)
    ap.add_argument("--bulk-size", type=int, default=65536)
    ap.add_argument("--client-threads", type=int, default=1,
                    help="client threads (1): the cores are 2, the client shares them")
    ap.add_argument("-w", "--workers", type=int, default=2,
                    help="sockherd workers and the peers' processes (2)")
    ap.add_argument("--threads", default="1", help="sockherd -t values, one row each (1)")
    ap.add_argument("--only", default="sockherd,asyncio,uvloop,c",
                    help="servers to run (sockherd,asyncio,uvloop,c)")
    ap.add_argument("--row-wait", type=float, default=0, metavar="S",
                    help="before each row wait at most S s for the box to be below 0.3 busy "
                         "cores (0: no wait)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="repeat every server this many times, interleaved (2)")
    a = ap.parse_args()
    a.loads = [x.strip() for x in a.loads.split(",") if x.strip()]
    only = [x.strip() for x in a.only.split(",") if x.strip()]
    bad = [x for x in a.loads if x not in ("small", "bulk")] + \
        [x for x in only if x not in ("sockherd",) + PEERS]
    if bad:
        ap.error(f"unknown load or server: {', '.join(bad)}")
    B.check_sockherd()
    if any(k in only for k in ("asyncio", "uvloop")):
        B.check_peers_venv()
    client = B.build_c("echo_pingpong", ["-pthread"])
    if "c" in only:
        B.build_c("c_echo_ref")
    plan = []
    for kind in only:
        if kind == "sockherd":
            plan += [("sockherd", int(t)) for t in a.threads.split(",") if t.strip()]
        else:
            plan.append((kind, 0))
    results = []
    with B.Procs() as procs, B.tempdir("echo_bench-") as tmp:
        head = B.header("echo_bench: stream echo ping-pong")
        for rnd in range(1, a.rounds + 1):
            for kind, threads in plan:
                print(f"# round {rnd}: {server_name(kind, a, threads)}", file=sys.stderr,
                      flush=True)
                if kind == "sockherd":
                    p, port, finish = start_sockherd(procs, tmp, a, threads, rnd)
                else:
                    p, port, finish = start_peer(procs, tmp, a, kind, rnd)
                rows = []
                for load in a.loads:
                    r = measure(p, client, port, a, load)
                    r.update(round=rnd, kind=kind, server=server_name(kind, a, threads))
                    rows.append(r)
                info = finish()
                for r in rows:
                    r.update(info)
                    print(f"#   {r}", file=sys.stderr, flush=True)
                results += rows
    report(results, a, head)
    return 1 if any(r["eof"] + r["reset"] + r["other_err"] + r["mismatch"] for r in results) \
        else 0


if __name__ == "__main__":
    sys.exit(main())
