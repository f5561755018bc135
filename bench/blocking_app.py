#!/usr/bin/env python3
"""blocking_app: a blocking WSGI app on sockherd, gunicorn gthread and granian,
in one run (issue 21: the blocking table, head-of-line, hello no-regression).

    .venv/bin/python bench/blocking_app.py [--rotations 3] [--only sockherd,gunicorn,granian]
        [--checkout DIR ...] [--parts table,hol] [--hello] [--quick] [--json rows.json]

Parts (--parts, default table,hol; --hello is --parts hello):

  table   the app of bench/apps/blocking.py sleeps 5 ms per request (the database
          call's stand-in); sockherd -w 2 --threads 8, gunicorn -k gthread -w 2
          --threads 8, granian --interface wsgi --workers 2 --blocking-threads 8,
          each under wrk -t1 -c64 -d6s --latency (keep-alive) after an uncounted
          1 s wrk run; req/s, p50, p99, max, the server tree's CPU per request,
          per rotation, then the median and range over the rotations, the ideal
          (workers x threads / 5 ms = 3,200 req/s) and issue 21's aims:
          sockherd/granian req/s >= 1.0, sockherd p99 / granian p99 <= 1.25,
          sockherd / ideal >= 0.95. The app also times its own sleeps in
          every row (BLOCKING_APP_STATS_DIR): the kernel wakes a sleeper
          late (timer slack, the VM's timer, a busy core), so no server can
          pass 16 / (the mean sleep it got); that bound and each server's
          share of it are printed beside the ideal
  hol     head-of-line: one worker, 8 threads (sockherd -w 1 --threads 8, gunicorn
          -w 1 --threads 8, granian --workers 1 --blocking-threads 8); 5
          connections loop on /slow (1 s each) while the client times 200 /fast,
          10 ms apart, on one keep-alive connection (opened before the slow
          ones), then 200 /fast each on a new connection (bench/hol_client.py;
          each phase cut at --hol-seconds); p50/p99/max, and the /slow calls'
          longest time (a slow connection queued behind another: > 1 s)
  hello   sockherd alone, bench/apps/hello.py at -w 2 --threads 1 and -w 2 --threads 2 under
          wrk -t1 -c50 -d5s, per checkout, alternated; req/s and server CPU per
          request, and the ratio of each checkout to the first (issue 21: no
          regression within 3 %), paired per rotation

Every server is started afresh for each row (in a rotation the order of the
servers turns by one, and checkouts alternate), measured, and stopped; each
sockherd gets a --runtime-dir of its own. --checkout DIR (repeatable; default
this checkout) runs sockherd from DIR/.venv/bin/sockherd, so a before/after
is one command: --checkout /path/to/base --checkout . ; the first is the
baseline of the ratios. The apps are always this checkout's bench/apps.

The machine may be shared: per row, `box busy` (the whole machine's busy
cores, 2.00 = both), wrk's cores and `other` (box - server - wrk - irq: other
processes) say how disturbed it was; compare rotations, not single rows.
--row-wait S waits (at most S s) before each row for the machine to be below
0.3 busy cores; a row that started on a busy machine says so in its notes.

Exit status: 0; 1 when a sockherd row had errors or a server failed; 2 for a
set-up problem.
"""
from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import benchlib as B
import hol_client as HC
import http_hello as H

SLEEP_MS = 5.0
PEERS = ("gunicorn", "granian")


# ---- servers ---------------------------------------------------------------------------------
class Target:
    """A server to measure: sockherd from a checkout, or a peer."""

    def __init__(self, kind: str, checkout: str = "", label: str = ""):
        self.kind, self.checkout = kind, checkout
        self.name = label or kind
        if kind == "sockherd":
            self.bin = os.path.join(checkout, ".venv", "bin", "sockherd")
            if not os.access(self.bin, os.X_OK):
                raise B.BenchError(f"{self.bin} missing: make that checkout's .venv first "
                                   "(python3 -m venv .venv && .venv/bin/pip install -e .)")
            helptext = subprocess.run([self.bin, "run", "--help"], capture_output=True,
                                      text=True, timeout=60).stdout
            self.has_runtime_dir = "--runtime-dir" in helptext

    def spec(self, app: str, port: int, workers: int, threads: int, tmp: str) -> tuple:
        """(argv, ready regex that appears once per worker, description)"""
        bind = f"127.0.0.1:{port}"
        if self.kind == "sockherd":
            extra = []
            if self.has_runtime_dir:
                extra = ["--runtime-dir", os.path.join(tmp, f"rt-{port}")]
            argv = [self.bin, "run", app, "--pythonpath", B.APPS, "-w", str(workers),
                    "--threads", str(threads), "-b", bind, *extra]
            return (argv, r"worker \d+\.\d+: ready, pid",
                    f"sockherd run {app} -w {workers} --threads {threads}")
        if self.kind == "gunicorn":
            argv = [H.peer_bin("gunicorn"), "-k", "gthread", "-w", str(workers),
                    "--threads", str(threads), "-b", bind, "--chdir", B.APPS,
                    "--no-control-socket", app]
            return (argv, r"Booting worker with pid",
                    f"gunicorn -k gthread -w {workers} --threads {threads} {app}")
        argv = [H.peer_bin("granian"), "--interface", "wsgi", "--workers", str(workers),
                "--blocking-threads", str(threads), "--host", "127.0.0.1", "--port", str(port),
                "--working-dir", B.APPS, app]
        return (argv, r"Started worker-\d+",
                f"granian --interface wsgi --workers {workers} --blocking-threads {threads} {app}")


class Running:
    """One server started for one row: waits for it, stops it."""

    def __init__(self, procs: B.Procs, tmp: str, target: Target, app: str, workers: int,
                 threads: int, env: dict):
        self.target, self.procs = target, procs
        self.port = B.free_port()
        self.argv, ready_re, self.desc = target.spec(app, self.port, workers, threads, tmp)
        self.log = os.path.join(tmp, f"{target.name}-{self.port}.log")
        self.p = procs.start(self.argv, log_path=self.log, env=env, cwd=B.APPS)

        def ready():
            if self.p.poll() is not None:
                raise B.BenchError(f"{target.name} exited with {self.p.returncode} before "
                                   "ready:\n" + B.read_text(self.log)[-3000:])
            return len(re.findall(ready_re, B.read_text(self.log))) >= workers
        B.wait_for(ready, 60, f"{target.name}: {workers} workers ready")

        def answering():            # a worker may log ready an instant before it serves
            conn = HC.HttpConn(self.port, 3)
            try:
                conn.request("/fast" if "blocking" in app else "/")
                return True
            except (OSError, ValueError):
                return False
            finally:
                conn.close()
        B.wait_for(answering, 20, f"{target.name} answering", interval=0.1)

    def problems(self) -> list[str]:
        return [ln.strip()[:160] for ln in B.read_text(self.log).splitlines()
                if re.search(r"error|traceback|exception|critical|respawn", ln, re.I)][:3]

    def stop(self) -> None:
        if self.procs.stop(self.p, signal.SIGTERM, timeout=20) is None:
            os.killpg(self.p.pid, signal.SIGKILL)


def wrk_row(srv: Running, conns: int, seconds: int, warmup: int, lua: str) -> dict:
    """wrk -t1 -cN --latency on / (after an uncounted warm-up): wrk's figures, the
    server tree's CPU over the window, wrk's and the machine's busy cores."""
    def argv(d):
        return ["wrk", "-t1", f"-c{conns}", f"-d{d}s", "--latency", "-s", lua,
                f"http://127.0.0.1:{srv.port}/"]
    if warmup > 0:
        subprocess.run(argv(warmup), capture_output=True, timeout=warmup + 60)
    t0 = H.proc_ticks(srv.p.pid)
    with B.BoxMeter() as box:
        r = subprocess.run(argv(seconds), capture_output=True, text=True, timeout=seconds + 60)
    t1 = H.proc_ticks(srv.p.pid)
    res = H.parse_result(r.stdout)
    cpu = sum(t1[p] - t0[p] for p in t0 if p in t1) / B.CLK_TCK
    res.update(rps=res["requests"] / (res["duration_us"] / 1e6), cpu_s=cpu,
               cpu_us_req=cpu / max(res["requests"], 1) * 1e6, cores=cpu / box.seconds,
               wrk=box.children_cpu / box.seconds, box=box.busy_cores,
               errors=sum(res[k] for k in ("status", "connect", "read", "write", "timeout")),
               notes=srv.problems() + ([f"wrk exit {r.returncode}"] if r.returncode else []))
    res["other"] = max(0.0, box.busy_cores - res["cores"] - res["wrk"] - box.irq_cores)
    return res


# ---- the parts -------------------------------------------------------------------------------
def rotated(items: list, k: int) -> list:
    k %= max(len(items), 1)
    return items[k:] + items[:k]


def settle(limit: float) -> list[str]:
    """Before a row: waits up to `limit` s for the machine to be below 0.3 busy
    cores (1 s windows); a note when it was not."""
    deadline = time.monotonic() + limit
    while limit > 0:
        busy = B.busy_now()
        if busy < 0.3:
            return []
        if time.monotonic() >= deadline:
            return [f"box not quiet ({busy:.2f} busy cores) after --row-wait {limit:g}"]
    return []


def log(msg: str) -> None:
    print(f"# [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


SLEEP_PROBE = '''
import threading, time
def run(out):
    t = time.perf_counter()
    for _ in range(N):
        time.sleep(S)
    out.append((time.perf_counter() - t) / N)
out = []
ts = [threading.Thread(target=run, args=(out,)) for _ in range(8)]
for t in ts: t.start()
for t in ts: t.join()
print(sum(out) / len(out))
'''


def sleep_probe(sleeps: int) -> float:
    """Seconds one time.sleep(SLEEP_MS) takes with no server: 8 threads of one
    process sleeping at once, as in one worker (the kernel's and the VM's late
    wake-ups, and the interpreter's own cost)."""
    code = f"N = {sleeps}\nS = {SLEEP_MS / 1e3!r}\n" + SLEEP_PROBE
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return float(out)


def part_table(a, targets, procs, tmp, lua, env) -> list[dict]:
    rows = []
    for rot in range(1, a.rotations + 1):
        settle(a.row_wait)
        slept = sleep_probe(50 if a.quick else 300)
        rows.append(dict(part="table", rotation=rot, server="probe", sleep_s=slept))
        log(f"probe {rot}: time.sleep({SLEEP_MS / 1e3:g}) alone takes {slept * 1e3:.3f} ms: "
            f"at most {16 / slept:,.0f} req/s")
        for t in rotated(targets, rot - 1):
            waited = settle(a.row_wait)
            stats = os.path.join(tmp, f"sleeps-{rot}-{t.name}")
            os.mkdir(stats)
            srv = Running(procs, tmp, t, "blocking:app", 2, 8,
                          dict(env, BLOCKING_APP_STATS_DIR=stats))
            try:
                r = wrk_row(srv, 64, a.seconds, a.warmup, lua)
            finally:
                srv.stop()
            r["sleep_s"] = mean_sleep(stats)
            r["notes"] += waited
            r.update(part="table", rotation=rot, server=t.name, desc=srv.desc)
            rows.append(r)
            log(f"table {rot} {t.name}: {r['rps']:,.0f} req/s, p50 {r['p50'] / 1e3:.1f} ms, "
                f"p99 {r['p99'] / 1e3:.1f} ms, errors {r['errors']}, box {r['box']:.2f}")
    return rows


def mean_sleep(stats: str) -> float | None:
    """The mean time one app sleep really took over a row, from the files the
    app's processes wrote (bench/apps/blocking.py), or None."""
    total, count = 0.0, 0
    for name in os.listdir(stats):
        if name.endswith(".tmp"):
            continue
        with open(os.path.join(stats, name)) as f:
            sec, n = f.read().split()
        total, count = total + float(sec), count + int(n)
    return total / count if count else None


def part_hol(a, targets, procs, tmp, env) -> list[dict]:
    rows = []
    for rot in range(1, a.rotations + 1):
        for t in rotated(targets, rot - 1):
            waited = settle(a.row_wait)
            srv = Running(procs, tmp, t, "blocking:app", 1, 8, env)
            ka = HC.HttpConn(srv.port, 10)
            loops = None
            try:
                ka.request("/fast")             # open before the slow connections come
                loops = HC.SlowLoops(srv.port, a.slow_conns)
                inside = HC.wait_slow_inside(srv.port, a.slow_conns, 15)
                gap = a.hol_interval / 1e3
                phases = {"keep-alive": HC.time_fast(srv.port, a.hol_count, a.hol_seconds, gap,
                                                     ka),
                          "new conn": HC.time_fast(srv.port, a.hol_count, a.hol_seconds, gap)}
            finally:
                ka.close()
                if loops:
                    loops.stop()
                srv.stop()
            for phase, f in phases.items():
                r = dict(part="hol", rotation=rot, server=t.name, desc=srv.desc, phase=phase,
                         n=len(f["lat"]), threads=f["threads"], errors=len(f["errors"]),
                         slow_seen=inside, slow_min=min(f["slow"], default=0),
                         slow_done=len(loops.latencies), slow_errors=len(loops.errors),
                         slow_max=max(loops.latencies, default=0.0),
                         notes=(f["errors"] + loops.errors)[:3] + srv.problems() + waited)
                r.update(pcts(f["lat"]))
                rows.append(r)
                log(f"hol {rot} {t.name} {phase}: {r['n']} /fast, p50 {r['p50']:.1f} ms, "
                    f"p99 {r['p99']:.1f} ms, max {r['max']:.1f} ms, slow inside {inside}")
    return rows


def part_hello(a, targets, procs, tmp, lua, env) -> list[dict]:
    rows = []
    for rot in range(1, a.rotations + 1):
        for threads in (1, 2):
            for t in (targets if rot % 2 else targets[::-1]):
                waited = settle(a.row_wait)
                srv = Running(procs, tmp, t, "hello:app", 2, threads, env)
                try:
                    r = wrk_row(srv, 50, a.hello_seconds, a.warmup, lua)
                finally:
                    srv.stop()
                r["notes"] += waited
                r.update(part="hello", rotation=rot, server=t.name, threads=threads,
                         desc=srv.desc)
                rows.append(r)
                log(f"hello {rot} --threads {threads} {t.name}: {r['rps']:,.0f} req/s, "
                    f"{r['cpu_us_req']:.1f} us CPU/req, box {r['box']:.2f}")
    return rows


def pcts(lat: list[float]) -> dict:
    """p50/p99/max in ms (nearest rank)"""
    if not lat:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    s = sorted(lat)
    return {"p50": s[int(0.50 * (len(s) - 1))] * 1e3, "p99": s[int(0.99 * (len(s) - 1))] * 1e3,
            "max": s[-1] * 1e3}


# ---- report ----------------------------------------------------------------------------------
def med(vals: list[float], fmt: str = "{:,.0f}") -> str:
    """median (min-max)"""
    if not vals:
        return "-"
    m = fmt.format(statistics.median(vals))
    return m if len(vals) == 1 else f"{m} ({fmt.format(min(vals))}-{fmt.format(max(vals))})"


def ratio(x, base) -> float | None:
    return x / base if x is not None and base else None


def verdict(x: float | None, aim: float, at_least: bool) -> str:
    if x is None:
        return "-"
    ok = x >= aim if at_least else x <= aim
    return f"{x:.3f} ({'met' if ok else 'NOT met'})"


def report_table(rows: list[dict], names: list[str], ideal: float) -> None:
    probes = [r["sleep_s"] for r in rows if r["server"] == "probe"]
    rows = [r for r in rows if r["server"] != "probe"]
    print(f"\n#### table: the app sleeps {SLEEP_MS:g} ms, 2 workers x 8 threads, "
          "wrk -t1 -c64 keep-alive\n")
    print(B.table(["rot", "server", "req/s", "p50 ms", "p99 ms", "max ms", "errors",
                   "server CPU us/req", "server cores", "wrk cores", "box busy", "other",
                   "notes"],
                  [[r["rotation"], r["server"], f"{r['rps']:,.0f}", f"{r['p50'] / 1e3:.1f}",
                    f"{r['p99'] / 1e3:.1f}", f"{r['max'] / 1e3:.1f}", r["errors"],
                    f"{r['cpu_us_req']:.0f}", f"{r['cores']:.2f}", f"{r['wrk']:.2f}",
                    f"{r['box']:.2f}", f"{r['other']:.2f}", "; ".join(r["notes"]) or "-"]
                   for r in rows]))
    by = {n: [r for r in rows if r["server"] == n] for n in names}
    print(f"\nMedian (min-max) over rotations; ideal {ideal:,.0f} req/s "
          f"(16 threads / {SLEEP_MS:g} ms), p50 = p99 = {64 / 16 * SLEEP_MS:g} ms:\n")
    if probes:
        bound = 16 / statistics.median(probes)
        print(f"The sleep probe (no server, 8 threads of one process sleeping at once, before "
              f"each rotation): time.sleep({SLEEP_MS / 1e3:g}) takes "
              f"{med([p * 1e3 for p in probes], '{:.3f}')} ms here, so no server can pass "
              f"{bound:,.0f} req/s, {bound / ideal:.3f} of the ideal.\n")
    print("`sleep ms`: the mean time the app's time.sleep(0.005) took in that server's "
          "rows, timed by the app (a thread's sleep ends when it has the GIL back: a server "
          "holding the GIL longer lengthens it); `vs sleep bound`: req/s over 16 / that "
          "sleep, the most any server could serve with those sleeps\n")
    print(B.table(["server", "req/s", "p50 ms", "p99 ms", "server CPU us/req", "vs ideal",
                   "sleep ms", "vs sleep bound"],
                  [[n, med([r["rps"] for r in rs]), med([r["p50"] / 1e3 for r in rs], "{:.1f}"),
                    med([r["p99"] / 1e3 for r in rs], "{:.1f}"),
                    med([r["cpu_us_req"] for r in rs]),
                    f"{statistics.median(r['rps'] for r in rs) / ideal:.3f}",
                    med([r["sleep_s"] * 1e3 for r in rs if r.get("sleep_s")], "{:.3f}"),
                    med([r["rps"] * r["sleep_s"] / 16 for r in rs if r.get("sleep_s")],
                        "{:.3f}")]
                   for n, rs in by.items() if rs]))
    gr = by.get("granian") or []
    g_rps = statistics.median(r["rps"] for r in gr) if gr else None
    g_p99 = statistics.median(r["p99"] for r in gr) if gr else None
    aims = []
    for n, rs in by.items():
        if not n.startswith("sockherd") or not rs:
            continue
        rps = statistics.median(r["rps"] for r in rs)
        p99 = statistics.median(r["p99"] for r in rs)
        aims.append([n, verdict(ratio(rps, g_rps), 1.0, True),
                     verdict(ratio(p99, g_p99), 1.25, False),
                     verdict(rps / ideal, 0.95, True)])
    print("\nIssue 21's aims (medians):\n")
    print(B.table(["server", "req/s vs granian (>= 1.0)", "p99 vs granian (<= 1.25)",
                   "req/s vs ideal (>= 0.95)"], aims))


def report_hol(rows: list[dict], names: list[str], a) -> None:
    print(f"\n#### head-of-line: 1 worker x 8 threads; {a.slow_conns} connections loop on "
          f"/slow (1 s); /fast timed, {a.hol_count} sequential requests {a.hol_interval:g} ms "
          f"apart per phase (cut at {a.hol_seconds:g} s); the keep-alive /fast connection "
          "opened before the slow ones\n")
    print(B.table(["rot", "server", "phase", "/fast done", "p50 ms", "p99 ms", "max ms",
                   "threads answering", "/slow inside (before; min at a /fast)",
                   "/slow done", "/slow max s", "errors", "notes"],
                  [[r["rotation"], r["server"], r["phase"], r["n"], f"{r['p50']:.2f}",
                    f"{r['p99']:.2f}", f"{r['max']:.2f}", r["threads"],
                    f"{r['slow_seen']}; {r['slow_min']}", r["slow_done"],
                    f"{r['slow_max']:.2f}", f"{r['errors']}/{r['slow_errors']}",
                    "; ".join(r["notes"]) or "-"] for r in rows]))
    print("\nMedian (min-max) over rotations:\n")
    out = []
    for n in names:
        for phase in ("keep-alive", "new conn"):
            rs = [r for r in rows if r["server"] == n and r["phase"] == phase]
            if rs:
                out.append([n, phase, med([r["n"] for r in rs]),
                            med([r["p50"] for r in rs], "{:.2f}"),
                            med([r["p99"] for r in rs], "{:.2f}"),
                            med([r["max"] for r in rs], "{:.2f}")])
    print(B.table(["server", "phase", "/fast done", "p50 ms", "p99 ms", "max ms"], out))


def report_hello(rows: list[dict], names: list[str]) -> None:
    print("\n#### hello: bench/apps/hello.py, sockherd -w 2, wrk -t1 -c50 keep-alive\n")
    print(B.table(["rot", "-t", "checkout", "req/s", "p99 ms", "errors", "server CPU us/req",
                   "server cores", "wrk cores", "box busy", "other", "notes"],
                  [[r["rotation"], r["threads"], r["server"], f"{r['rps']:,.0f}",
                    f"{r['p99'] / 1e3:.2f}", r["errors"], f"{r['cpu_us_req']:.1f}",
                    f"{r['cores']:.2f}", f"{r['wrk']:.2f}", f"{r['box']:.2f}",
                    f"{r['other']:.2f}", "; ".join(r["notes"]) or "-"] for r in rows]))
    base = names[0]
    out = []
    for threads in (1, 2):
        for n in names:
            rs = [r for r in rows if r["server"] == n and r["threads"] == threads]
            pairs = [(r, b) for r in rs for b in rows
                     if b["server"] == base and b["threads"] == threads
                     and b["rotation"] == r["rotation"]]
            out.append([f"-t {threads}", n, med([r["rps"] for r in rs]),
                        med([r["cpu_us_req"] for r in rs], "{:.1f}"),
                        "-" if n == base else med([r["rps"] / b["rps"] for r, b in pairs],
                                                  "{:.3f}"),
                        "-" if n == base else med([r["cpu_us_req"] / b["cpu_us_req"]
                                                   for r, b in pairs], "{:.3f}")])
    print(f"\nMedian (min-max) over rotations; ratios to {base}, paired per rotation "
          "(issue 21: req/s within 3 %):\n")
    print(B.table(["threads", "checkout", "req/s", "server CPU us/req",
                   f"req/s / {base}", f"CPU per req / {base}"], out))


def checkout_line(t: Target) -> str:
    def git(*args):
        # rstrip: porcelain's first line starts with its status column (" M path")
        return subprocess.run(["git", "-C", t.checkout, *args], capture_output=True,
                              text=True).stdout.rstrip()
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "master", "worker",
                "fdcore", "ipc")
    return (f"- {t.name}: {t.checkout}, git {git('rev-parse', '--short', 'HEAD')} "
            f"({git('log', '-1', '--format=%s')[:70]}), modified in master/ worker/ fdcore/ "
            f"ipc/: {' '.join(ln[3:] for ln in dirty.splitlines()) or 'none'}")


# ---- main ------------------------------------------------------------------------------------
def sockherd_targets(checkouts: list[str]) -> list[Target]:
    paths = [os.path.abspath(c) for c in checkouts] or [B.ROOT]
    labels = [f"sockherd@{os.path.basename(p)}" for p in paths] if len(paths) > 1 else ["sockherd"]
    if len(set(labels)) < len(labels):
        labels = [f"{lb}#{i + 1}" for i, lb in enumerate(labels)]
    return [Target("sockherd", p, lb) for p, lb in zip(paths, labels)]


def main() -> int:
    ap = B.arg_parser(__doc__)
    ap.add_argument("--parts", default="table,hol", help="table,hol,hello (table,hol)")
    ap.add_argument("--hello", action="store_true", help="the hello check alone (--parts hello)")
    ap.add_argument("--only", default="sockherd," + ",".join(PEERS),
                    help="servers of table and hol (sockherd,gunicorn,granian)")
    ap.add_argument("--checkout", action="append", default=[], metavar="DIR",
                    help="run sockherd from DIR/.venv (repeatable; the first is the "
                         "baseline; default: this checkout)")
    ap.add_argument("--rotations", type=int, default=3, help="rotations (3)")
    ap.add_argument("--seconds", type=int, default=6, help="wrk seconds per table row (6)")
    ap.add_argument("--hello-seconds", type=int, default=5, help="wrk seconds per hello row (5)")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted wrk seconds first (1)")
    ap.add_argument("--slow-conns", type=int, default=5, help="hol: /slow loops (5)")
    ap.add_argument("--hol-count", type=int, default=200, help="hol: /fast per phase (200)")
    ap.add_argument("--hol-seconds", type=float, default=10, help="hol: phase cut (10 s)")
    ap.add_argument("--hol-interval", type=float, default=10,
                    help="hol: ms between two /fast (10: a phase spans ~2 slow calls)")
    ap.add_argument("--row-wait", type=float, default=0, metavar="S",
                    help="before each row, wait up to S s for the machine below 0.3 busy "
                         "cores (a shared box; 0: no wait)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 rotation, 1 s wrk rows, no warm-up, 20 /fast cut at 3 s")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    a = ap.parse_args()
    # TERM ends the run like Ctrl-C: the Procs context below then kills and reaps
    # every server started (a harness stopping the script leaves none behind)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.quick:
        a.rotations, a.seconds, a.hello_seconds, a.warmup = 1, 1, 1, 0
        a.hol_count, a.hol_seconds = 20, 3.0
    parts = ["hello"] if a.hello else [p.strip() for p in a.parts.split(",") if p.strip()]
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    for p in parts:
        if p not in ("table", "hol", "hello"):
            ap.error(f"unknown part {p!r}")
    for s in only:
        if s not in ("sockherd", *PEERS):
            ap.error(f"unknown server {s!r}")
    if subprocess.run(["sh", "-c", "command -v wrk"], capture_output=True).returncode:
        raise B.BenchError("wrk missing: run `sh bench/setup_peers.sh` first")
    shs = sockherd_targets(a.checkout)
    peers = [Target(p) for p in PEERS if p in only] if {"table", "hol"} & set(parts) else []
    if peers:
        B.check_peers_venv()
    targets = (shs if "sockherd" in only else []) + peers
    names = [t.name for t in targets]
    env = dict(os.environ, BLOCKING_APP_SLEEP_MS=f"{SLEEP_MS:g}")
    head = B.header("blocking_app: issue 21's blocking app, head-of-line and hello check")
    t0 = time.monotonic()
    rows: list[dict] = []
    failures: list[str] = []
    with B.Procs() as procs, B.tempdir("blocking_app-") as tmp:
        # each sockherd's control socket is TMP/rt-PORT/control: a unix socket
        # path has at most 107 bytes (sockherd then says "served by another
        # running master", which misleads)
        if len(os.path.join(tmp, "rt-65535", "control")) > 100:
            raise B.BenchError(f"temporary directory {tmp} too deep for sockherd's control "
                               "socket path (107 bytes at most): set TMPDIR to a shorter one")
        lua = os.path.join(tmp, "done.lua")
        with open(lua, "w") as f:
            f.write(H.LUA_DONE)
        for part in parts:
            try:
                if part == "table":
                    rows += part_table(a, targets, procs, tmp, lua, env)
                elif part == "hol":
                    rows += part_hol(a, targets, procs, tmp, env)
                else:
                    rows += part_hello(a, shs, procs, tmp, lua, env)
            except (B.BenchError, subprocess.TimeoutExpired, OSError, ValueError) as e:
                failures.append(f"{part}: {type(e).__name__}: {e}")
                log(f"{part} FAILED: {e}")
    print(head)
    print(f"- peers: {H.versions() if peers else 'not run'}")
    for t in shs:
        print(checkout_line(t))
    print(f"- parts {','.join(parts)}; {a.rotations} rotation(s), servers started afresh per "
          f"row, order turned by one per rotation; total {time.monotonic() - t0:.0f} s")
    print("- `box busy`: the machine's busy cores over the row (2.00 = both); `other` = box "
          "busy - server - wrk - irq: other processes of the shared machine")
    for part, fn in (("table", lambda rs: report_table(rs, names, 16 / (SLEEP_MS / 1e3))),
                     ("hol", lambda rs: report_hol(rs, names, a)),
                     ("hello", lambda rs: report_hello(rs, [t.name for t in shs]))):
        rs = [r for r in rows if r["part"] == part]
        if rs:
            fn(rs)
    if failures:
        print("\n#### FAILURES\n")
        for f_ in failures:
            print(f"- {f_}")
    print(B.footer())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    bad = [r for r in rows if r["server"].startswith("sockherd") and r["errors"]]
    return 1 if failures or bad else 0


if __name__ == "__main__":
    B.run_main(main, "blocking_app")
