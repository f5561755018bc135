#!/usr/bin/env python3
"""asgi_bound: the ceiling any server can reach on issue 22 §5's "FastAPI
>= 1.3x uvicorn" (ka-c50, 2 workers) on this box, measured in one run.

    .venv/bin/python bench/asgi_bound.py [--rounds 3] [--seconds 8]
        [--only sockherd,uvicorn,granian] [--wait-quiet 20] [--quick] [--json F]

What it measures, every round (servers side by side, each idle while another
is measured, as in asgi_hello.py; bench/apps/fastapi_json.py served by
asgi_hello.py's command lines: sockherd -w 2 --threads 1, uvicorn --workers 2
httptools+uvloop, granian --workers 2):

  a row per server   wrk -t2 -c50 keep-alive for --seconds (after a 1 s
                     uncounted run): req/s; per request, the server's user
                     and sys CPU (utime/stime deltas of every process of its
                     tree, /proc/PID/stat), wrk's user+sys (its own rusage,
                     wait4), and the whole box's busy time split into user,
                     sys, irq+softirq (/proc/stat)
  a perf row         another wrk run of --perf-seconds under `perf stat -e
                     raw_syscalls:sys_enter,context-switches,syscalls:...`
                     (tracepoints: no PMU needed) on the server's processes
                     and on wrk: syscalls, reads, writes, epoll waits and
                     context switches per request. Kept apart from the timed
                     row so perf's own cost is not in its figures.
  the app alone      bench/asgi_app_cost.py --timed: the FastAPI app called in
                     process by its driver (no server, no socket, no task per
                     request), by sockherd's interpreter (.venv/bin/python,
                     the one our workers run), CPU per request by os.times:
                     once alone ("idle": the servers idle, pinned to CPU 0)
                     and once as two processes at once, one pinned per core
                     ("busy": both cores busy, as in the rows).

The ceiling. The box is saturated in the rows (busy ~2.00 cores), so a
server's req/s = cores / T, T = the CPU per request of the server (user U +
sys S), wrk (W) and the ksoftirqd threads (K). A server whose own user-space
cost is zero
still runs the app: its T would be T(sockherd) - U(sockherd) + A, with U
our workers' user CPU per request and A the app alone's (the "busy" figure:
the rows' workers share both cores with wrk and softirq, as the two drivers
do). Ceiling = T(uvicorn) / (T(sockherd) - U(sockherd) + A); and the user CPU
per request our workers would need for 1.3x: T(uvicorn) / 1.3 - (T(sockherd)
- U(sockherd)). The inputs are printed; the report lists what the model leaves
out. /proc/stat's softirq is not added to T: this kernel's tick accounting (no
CONFIG_IRQ_TIME_ACCOUNTING) charges a tick spent in softirq both to it and to
the stime of the task it interrupted, so the softirq that loopback runs in the
server's and wrk's context is in S and W already. The same ceiling from the
box's busy time per request is printed too (equal on a quiet box). The
non-user part (S + W + K) is sockherd's own and not a constant of the box:
a server whose answers wake wrk less often makes it smaller (granian's rows
show it), so the report also gives the ceiling with the lowest non-user part
any server of the round showed.

The inputs move with other load: on a shared box (the `other` column, the
load average) the workers' CPU per request and wrk's wake-ups change; run it
on a quiet box (--wait-quiet 20) for a figure to quote.

Exit status: 0; 1 when a sockherd row had errors or a failed probe, or a
server stopped answering; 2 for a set-up problem.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time

import asgi_hello as A
import benchlib as B
import http_hello as H
import rotations as R

SERVERS = ("sockherd", "uvicorn", "granian")
LOAD = "ka-c50"
AIM = 1.3
APP_COST = os.path.join(B.HERE, "asgi_app_cost.py")
# per-syscall tracepoints summed into the report's columns (servers use
# different calls: uvloop read/write, sockherd's C core recv/send...)
SYSCALLS = {
    "reads": ("read", "readv", "recvfrom", "recvmsg"),
    "writes": ("write", "writev", "sendto", "sendmsg"),
    "epoll": ("epoll_wait", "epoll_pwait", "epoll_pwait2"),
}
EVENTS = ["raw_syscalls:sys_enter", "context-switches"] + [
    f"syscalls:sys_enter_{c}" for calls in SYSCALLS.values() for c in calls]


# ---- samples -------------------------------------------------------------------------------------
def cpu_times(pids: list[int]) -> dict[int, tuple[int, int]]:
    """(utime, stime) ticks of each pid still alive."""
    out = {}
    for pid in pids:
        try:
            st = B._stat_fields(f"/proc/{pid}/stat")
            out[pid] = (int(st[11]), int(st[12]))
        except OSError:
            pass
    return out


def ksoftirqd() -> list[int]:
    """The pids of the ksoftirqd/N kernel threads (softirq work deferred to
    them is charged to their stime)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().startswith("ksoftirqd/"):
                    out.append(int(pid))
        except OSError:
            pass
    return out


def box_stat() -> list[int]:
    """/proc/stat's cpu line: user nice system idle iowait irq softirq steal."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def box_split(v0: list[int], v1: list[int]) -> dict:
    """Busy core-seconds of the box between two box_stat()s, split."""
    d = [(b - a) / B.CLK_TCK for a, b in zip(v0, v1)]
    return {"user": d[0] + d[1], "sys": d[2], "irq": d[5] + d[6], "steal": d[7],
            "busy": d[0] + d[1] + d[2] + d[5] + d[6] + d[7]}


def run_wrk(argv: list[str]) -> tuple[str, int, float]:
    """wrk to its end: (its output, exit status, its user+sys CPU seconds
    from its own rusage)."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = p.stdout.read()
        _, status, ru = os.wait4(p.pid, 0)
    except BaseException:
        p.kill()
        p.wait()
        raise
    p.returncode = os.waitstatus_to_exitcode(status)    # reaped here, not by Popen
    p.stdout.close()
    return out, p.returncode, ru.ru_utime + ru.ru_stime


# ---- a row ---------------------------------------------------------------------------------------
def measure(srv: H.Server, a, lua: str) -> dict:
    """One timed row of srv under ka-c50: req/s and CPU per request."""
    verdict, _ = H.probe(srv.port, [], expect=srv.expect)
    notes = [] if verdict == "ok" else [f"probe: {verdict}"]
    pids, kpids = B.tree(srv.p.pid), ksoftirqd()
    if a.warmup > 0:
        run_wrk(H.wrk_argv(srv.port, LOAD, a.warmup, lua))
        time.sleep(0.3)                                  # the warm-up's tail lands
    c0, k0, v0, w0 = cpu_times(pids), cpu_times(kpids), box_stat(), time.monotonic()
    out, rc, wrk_cpu = run_wrk(H.wrk_argv(srv.port, LOAD, a.seconds, lua))
    c1, k1, v1, window = cpu_times(pids), cpu_times(kpids), box_stat(), time.monotonic() - w0
    if rc != 0:
        notes.append(f"wrk exit {rc}")
    if set(c0) != set(c1):
        notes.append(f"process tree changed: {sorted(c0)} -> {sorted(c1)}")
    notes += [f"log: {ln[:160]}" for ln in srv.new_log_problems()[:3]]
    res = H.parse_result(out)
    n = res["requests"]
    user = sum(c1[p][0] - c0[p][0] for p in c0 if p in c1) / B.CLK_TCK
    sys_ = sum(c1[p][1] - c0[p][1] for p in c0 if p in c1) / B.CLK_TCK
    ksoft = sum(sum(k1[p]) - sum(k0[p]) for p in k0 if p in k1) / B.CLK_TCK
    box = box_split(v0, v1)
    us = 1e6 / n if n else float("nan")
    res.update(server=srv.name.split(".")[0], rps=n / (res["duration_us"] / 1e6),
               window=window, busy_cores=box["busy"] / window,
               U=user * us, S=sys_ * us, W=wrk_cpu * us, K=ksoft * us,
               T=(user + sys_ + wrk_cpu + ksoft) * us, box=box["busy"] * us,
               box_user=box["user"] * us, box_sys=box["sys"] * us, box_irq=box["irq"] * us,
               box_steal=box["steal"] * us, notes=notes)
    # what else the box did: other processes, softirq in idle time
    res["other"] = max(0.0, box["busy"] - user - sys_ - wrk_cpu - ksoft) / window
    return res


def quiet_box(a, t_start: float) -> None:
    """Waits (at most --row-wait s, none past --budget s into the run) for
    the box below 0.3 busy cores."""
    deadline = time.monotonic() + (0 if time.monotonic() - t_start > a.budget else a.row_wait)
    while time.monotonic() < deadline and B.busy_now() >= 0.3:
        pass


def measure_quiet(srv: H.Server, a, lua: str, t_start: float) -> dict:
    """measure() after a wait (at most --row-wait s) for a box below 0.3 busy
    cores; measured again (--retries) when other processes took more than
    --max-other cores (box busy - server - wrk - ksoftirqd), the least
    disturbed kept."""
    best = None
    for attempt in range(1 + a.retries):
        quiet_box(a, t_start)
        r = measure(srv, a, lua)
        r["attempt"] = attempt + 1
        if best is None or r["other"] < best["other"]:
            best = r
        if (best["other"] <= a.max_other or attempt == a.retries
                or time.monotonic() - t_start > a.budget):
            break
        print(f"#   {srv.name}: other load {r['other']:.2f} cores, measuring again",
              file=sys.stderr, flush=True)
    if best["other"] > a.max_other or best["attempt"] > 1:
        best["notes"].append(f"attempt {best['attempt']}; other {best['other']:.2f} cores")
    return best


def perf_counts(path: str) -> dict[str, int]:
    """perf stat -x, output: event -> count (0 for <not counted>)."""
    out = {}
    for line in B.read_text(path).splitlines():
        f = line.split(",")
        if len(f) > 2 and not line.startswith("#"):
            out[f[2]] = int(f[0]) if f[0].isdigit() else 0
    return out


def perf_row(srv: H.Server, a, lua: str, tmp: str) -> dict:
    """Syscalls and context switches per request, of the server's processes
    and of wrk, over a wrk run of --perf-seconds under perf stat."""
    sfile, wfile = os.path.join(tmp, "perf-server.txt"), os.path.join(tmp, "perf-wrk.txt")
    ev = ",".join(EVENTS)
    pids = ",".join(str(p) for p in B.tree(srv.p.pid))
    ps = subprocess.Popen(["perf", "stat", "-x,", "-o", sfile, "-e", ev, "-p", pids],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)                                  # perf attached to every thread
        out, rc, _ = run_wrk(["perf", "stat", "-x,", "-o", wfile, "-e", ev, "--",
                              *H.wrk_argv(srv.port, LOAD, a.perf_seconds, lua)])
    finally:
        ps.send_signal(signal.SIGINT)
        try:
            _, err = ps.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            ps.kill()
            _, err = ps.communicate()
    n = H.parse_result(out)["requests"] if rc == 0 else 0
    ok = rc == 0 and ps.returncode in (0, -signal.SIGINT)
    r = {"perf_requests": n, "perf_note": "" if ok
         else f"perf: wrk exit {rc}, server perf exit {ps.returncode} {err.strip()[-200:]}"}
    for who, path in (("srv", sfile), ("wrk", wfile)):
        c = perf_counts(path)
        per = (lambda x: x / n) if n else (lambda x: float("nan"))
        r[f"{who}_syscalls"] = per(c.get("raw_syscalls:sys_enter", 0))
        r[f"{who}_cs"] = per(c.get("context-switches", 0))
        for col, calls in SYSCALLS.items():
            r[f"{who}_{col}"] = per(sum(c.get(f"syscalls:sys_enter_{x}", 0) for x in calls))
    return r


# ---- the app alone ----------------------------------------------------------------------------------
def app_alone(python: str, cpus: list[int], a) -> dict:
    """len(cpus) drivers at once (asgi_app_cost.py --timed), each pinned to
    its CPU: CPU µs per request (user + sys), mean over the drivers."""
    argv = [python, APP_COST, "--app", "fastapi", "--timed", str(a.app_requests),
            "--warmup", str(a.app_warmup)]
    ps = [subprocess.Popen(argv + ["--cpu", str(c)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for c in cpus]
    got = []
    for p in ps:
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            raise B.BenchError(f"asgi_app_cost.py --timed exited {p.returncode}: {err[-500:]}")
        got.append(json.loads(out.strip().splitlines()[-1]))
    user = statistics.mean(g["user_s"] / g["requests"] * 1e6 for g in got)
    sys_ = statistics.mean(g["sys_s"] / g["requests"] * 1e6 for g in got)
    wall = statistics.mean(g["wall_s"] / g["requests"] * 1e6 for g in got)
    return {"A": user + sys_, "user": user, "sys": sys_, "wall": wall, "procs": len(cpus)}


# ---- the model ----------------------------------------------------------------------------------------
def ceiling(ours: dict, uv: dict, app: dict, others: list[dict]) -> dict:
    """The zero-cost-user server's bound against uvicorn, from one round's rows
    (others: every server's row of the round, for the lowest fixed part)."""
    fixed = ours["T"] - ours["U"]                      # all but our workers' user time
    c = {"fixed": fixed, "T0": fixed + app["A"], "need_U": uv["T"] / AIM - fixed,
         "measured": ours["rps"] / uv["rps"], "model": uv["T"] / ours["T"]}
    c["ceiling"] = uv["T"] / c["T0"]
    # the same from the box's busy time per request (/proc/stat): equal on a quiet box,
    # inflated by other processes on a shared one
    c["ceiling_box"] = uv["box"] / (ours["box"] - ours["U"] + app["A"])
    # the fixed part is not a constant of the box: a server answering in bursts
    # costs wrk fewer wake-ups (granian's rows); the lowest any server showed
    low = min(others, key=lambda r: r["T"] - r["U"])
    c["low_name"], c["low_fixed"] = low["server"], low["T"] - low["U"]
    c["ceiling_low"] = uv["T"] / (c["low_fixed"] + app["A"])
    c["need_U_low"] = uv["T"] / AIM - c["low_fixed"]
    return c


def fmt(x: float, f: str = "{:.1f}") -> str:
    return "-" if x != x else f.format(x)


def report(results: list[dict], apps: dict, a) -> None:
    rounds = sorted({r["round"] for r in results})
    print(f"\n#### Rows ({LOAD}: wrk -t {H.WRK_THREADS} -c 50 keep-alive, {a.seconds:g} s; "
          "µs per request unless said)\n")
    rows = []
    for r in results:
        rows.append([r["round"], r["server"], f"{r['rps']:,.0f}", f"{r['busy_cores']:.2f}",
                     fmt(r["U"]), fmt(r["S"]), fmt(r["W"]), fmt(r["K"]), fmt(r["T"]),
                     fmt(r["box"]), fmt(r["box_user"]), fmt(r["box_sys"]), fmt(r["box_irq"]),
                     f"{r['other']:.2f}", "; ".join(r["notes"]) or "-"])
    print(B.table(["round", "server", "req/s", "box busy cores", "server user U",
                   "server sys S", "wrk W", "ksoftirqd K", "T = U+S+W+K", "box busy",
                   "of which user", "sys", "irq+softirq", "other cores", "notes"], rows))
    print(f"\n#### Syscalls and context switches per request (perf stat tracepoints, a "
          f"separate {a.perf_seconds:g} s wrk run)\n")
    rows = []
    for r in results:
        rows.append([r["round"], r["server"], f"{r['perf_requests']:,}"] + [
            fmt(r[f"{w}_{k}"], "{:.2f}") for w in ("srv", "wrk")
            for k in ("syscalls", "reads", "writes", "epoll", "cs")] + [r["perf_note"] or "-"])
    print(B.table(["round", "server", "requests", "server syscalls", "reads", "writes",
                   "epoll waits", "context sw.", "wrk syscalls", "wrk reads", "wrk writes",
                   "wrk epoll waits", "wrk context sw.", "notes"], rows))
    print("\n#### The app alone (asgi_app_cost.py --timed: FastAPI called in process, "
          f"{a.app_requests} requests after {a.app_warmup})\n")
    rows = []
    for rnd in rounds:
        for kind in ("idle", "busy"):
            x = apps[rnd][kind]
            rows.append([rnd, kind, x["procs"], fmt(x["user"]), fmt(x["sys"]), fmt(x["A"]),
                         fmt(x["wall"])])
    print(B.table(["round", "kind", "processes at once", "user µs/req", "sys µs/req",
                   "CPU µs/req (A)", "wall µs/req"], rows))
    if "sockherd" in a.servers and "uvicorn" in a.servers:
        print_ceiling(results, apps, rounds)


def print_ceiling(results: list[dict], apps: dict, rounds: list[int]) -> None:
    print(f"\n#### The ceiling: a server whose own user-space cost is zero, against uvicorn "
          f"(aim {AIM}x)\n")
    rows, ceils = [], []
    for rnd in rounds:
        by = {r["server"]: r for r in results if r["round"] == rnd}
        if "sockherd" not in by or "uvicorn" not in by:
            continue
        ours, uv, app = by["sockherd"], by["uvicorn"], apps[rnd]["busy"]
        c = ceiling(ours, uv, app, list(by.values()))
        ceils.append(c)
        rows.append([rnd, fmt(uv["T"]), fmt(ours["T"]), fmt(ours["U"]), fmt(c["fixed"]),
                     fmt(app["A"]), fmt(c["T0"]), f"{c['measured']:.2f}", f"{c['model']:.2f}",
                     f"**{c['ceiling']:.2f}**", f"{c['ceiling_box']:.2f}",
                     fmt(c["need_U"]), f"{c['need_U'] / app['A']:.2f}",
                     f"{c['low_name']}: {c['low_fixed']:.1f}", f"{c['ceiling_low']:.2f}",
                     fmt(c["need_U_low"])])
    print(B.table(["round", "uvicorn T", "sockherd T", "sockherd U",
                   "fixed = T - U (ours)", "app alone A (busy)", "zero-cost T0 = fixed + A",
                   "measured sockherd/uvicorn req/s", "model T(uv)/T(ours)",
                   "ceiling T(uv)/T0", "ceiling, box form", "U needed for 1.3x",
                   "U needed / A", "lowest fixed (S+W+K) of any server",
                   "ceiling with it", "U needed with it"], rows))
    if ceils:
        med = statistics.median(c["ceiling"] for c in ceils)
        need = statistics.median(c["need_U"] for c in ceils)
        a_busy = statistics.median(apps[r]["busy"]["A"] for r in rounds)
        print(f"\n- ceiling (median over {len(ceils)} round(s)): **{med:.2f}x uvicorn**; "
              f"1.3x needs our workers' user CPU at {need:.1f} µs per request, the app alone "
              f"takes {a_busy:.1f} µs (busy): "
              + ("below it, so no server with sockherd's sys, wrk and softirq costs reaches "
                 "1.3x" if need < a_busy else "above it, so the aim is within reach of a server "
                 "with sockherd's sys, wrk and softirq costs")
              + "; with the lowest non-user part any server showed: "
              f"{statistics.median(c['ceiling_low'] for c in ceils):.2f}x, U needed "
              f"{statistics.median(c['need_U_low'] for c in ceils):.1f} µs")
    print("""- the ceiling uses the app alone measured **busy** (two drivers at once, one per
  core): in the rows the workers share both cores with wrk and softirq, so the box's
  shared caches and memory bandwidth are contended as they are between the two drivers;
  the idle figure (one driver, the other core idle) is printed for comparison
- inputs (µs per request): U and S = the server tree's utime and stime, W = wrk's
  user + sys (its rusage), K = the ksoftirqd threads' CPU, T = U + S + W + K; fixed =
  T - U of sockherd (its sys, its wrk and softirq share); ceiling = T(uvicorn) / (fixed
  + A); U needed = T(uvicorn) / 1.3 - fixed. Softirq is in S and W already: this kernel
  accounts by ticks (no CONFIG_IRQ_TIME_ACCOUNTING), and a tick that lands in softirq
  run in a task's context (loopback's receive path, run when the sender enables bottom
  halves) is charged to that task's stime as well as to /proc/stat's softirq; only
  what ksoftirqd runs is outside them (K). Adding /proc/stat's irq+softirq would count
  it twice. The box form uses the box's busy time per request (/proc/stat) for T: the
  same on a quiet box (check: box busy ~ T), larger when other processes ran
- what the model ignores: (1) cache and TLB effects of sharing cores: the app alone runs
  without a server's code and data between requests, so A may be lower than the app's
  cost inside any real server (the ceiling is then generous); (2) our sys, wrk and softirq
  per request are taken as they are with sockherd: a server could make fewer syscalls only
  by batching, and keep-alive without pipelining needs at least one read and one write
  per request (the perf table: wrk writes ~1.00 per request, one request in flight per
  connection; bench/http_hello.py's wrk script defines no request(), so wrk pipelines
  nothing); (3) wrk's CPU and the server's sys per request change with how the answers
  come (fewer wake-ups when they come in bursts): the fixed part is sockherd's, and a
  server whose answers made wrk and the kernel cheaper could pass the ceiling; the last
  columns put in the lowest fixed part (S + W + K) any server of the round showed;
  (4) a box not fully busy (busy cores below ~2.00) breaks req/s = cores / T; (5) other processes on a shared box take
  cores (the `other` column) and caches: T counts only the rows' own processes, so the
  ratios hold better than req/s, but cache sharing still moves U and A""")


# ---- main -----------------------------------------------------------------------------------------
def main() -> int:
    ap = B.arg_parser(__doc__)
    ap.add_argument("--seconds", type=float, default=8.0, help="timed seconds per row (8)")
    ap.add_argument("--warmup", type=float, default=1.0,
                    help="an uncounted wrk run before each row (1; whole seconds)")
    ap.add_argument("--perf-seconds", type=float, default=3.0,
                    help="the perf row's wrk run (3)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds: every server once each, its order turned by one (3)")
    ap.add_argument("--only", default=",".join(SERVERS), help="servers: " + ",".join(SERVERS))
    ap.add_argument("--app-requests", type=int, default=20000,
                    help="the app alone's timed requests per driver (20000)")
    ap.add_argument("--app-warmup", type=int, default=2000,
                    help="the app alone's uncounted requests first (2000)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 round, 2 s rows, 1 s perf rows, 2000 app requests")
    R.add_quiet_arguments(ap, budget=300)
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.seconds, a.perf_seconds = 1, 2.0, 1.0
        a.app_requests, a.app_warmup = 2000, 300
    a.servers = [s for s in a.only.split(",") if s]
    for s in a.servers:
        if s not in SERVERS:
            ap.error(f"unknown server {s!r}")
    if "sockherd" in a.servers and (why := A.sockherd_skip(B.ROOT, "fastapi")):
        raise B.BenchError(why)
    R.check_tools(a.servers)
    if subprocess.run(["perf", "--version"], capture_output=True).returncode:
        raise B.BenchError("perf missing (Debian package linux-perf)")
    python = os.path.join(B.ROOT, ".venv", "bin", "python")
    quiet = H.wait_quiet(a.wait_quiet) if a.wait_quiet > 0 else ""
    head = B.header("asgi_bound: the ceiling on FastAPI >= 1.3x uvicorn (ka-c50, 2 workers)")
    vers = A.versions()
    load0 = R.loadavg()
    results, failures, apps = [], [], {}
    t_start = time.monotonic()
    with B.Procs() as procs, B.tempdir("asgi_bound-") as tmp:
        specs = {f"{s}.fastapi": (A.spec_for(s, "fastapi", B.ROOT, tmp), A.APPS["fastapi"][1])
                 for s in a.servers}
        servers, lua = R.start(procs, tmp, specs)
        for rnd in range(1, a.rounds + 1):
            quiet_box(a, t_start)
            apps[rnd] = {"idle": app_alone(python, [0], a),
                         "busy": app_alone(python, list(range(min(2, os.cpu_count()))), a)}
            print(f"# round {rnd}: app alone {apps[rnd]['idle']['A']:.1f} µs idle, "
                  f"{apps[rnd]['busy']['A']:.1f} µs busy", file=sys.stderr, flush=True)
            for srv in R.rotated(list(servers.values()), rnd):
                if srv.failed:
                    continue
                try:
                    r = measure_quiet(srv, a, lua, t_start)
                    r.update(perf_row(srv, a, lua, tmp), round=rnd)
                except (B.BenchError, subprocess.TimeoutExpired) as e:
                    srv.failed = H.failure_report(srv, LOAD, rnd, e, t_start)
                    failures.append(srv.failed)
                    continue
                results.append(r)
                print(f"# round {rnd} {r['server']}: {r['rps']:,.0f} req/s, U {r['U']:.1f} "
                      f"S {r['S']:.1f} W {r['W']:.1f} T {r['T']:.1f} µs/req",
                      file=sys.stderr, flush=True)
        stops = {name: srv.stop() for name, srv in servers.items()}
    R.print_head(head, quiet, load0, vers, a, time.monotonic() - t_start)
    print(f"- the app alone: {python} (the interpreter of sockherd's workers)")
    for name, srv in servers.items():
        print(f"- {name}: `{srv.spec['desc']}`; stop: {stops[name]}")
    report(results, apps, a)
    for r in results:
        r["app"] = apps[r["round"]]                     # in the JSON rows
    return R.end(results, failures, a)


if __name__ == "__main__":
    B.run_main(main, "asgi_bound")
