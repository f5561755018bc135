#!/usr/bin/env python3
"""Benchmark of sockherd's native fd core (fdcore), C level and Python level.

Builds bench/fdcore_bench.c against fdcore/*.c into a temporary directory with

    gcc -O2 -pthread -I fdcore fdcore/*.c \
        bench/fdcore_bench.c

runs its modes (each bounded in time), runs the Python-level measurements
through the cffi wrapper (sockherd.fdcore.Table) and their peers (select.epoll,
selectors.EpollSelector), and prints one table with the command line on top.

    .venv/bin/python bench/fdcore_bench.py                 # all non-stress modes (< 2 min)
    .venv/bin/python bench/fdcore_bench.py --quick         # shorter, for a smoke run
    .venv/bin/python bench/fdcore_bench.py --stress-ops 100000000 [--stress-profile safe]

The stress mode is a benchmark run, not a test: random insert / delete /
takeover / enter / leave / want / stop / poll on a pool of real fds with
immediate number reuse, checking invariants as it goes (see README.md).

Figures are rates over wall-clock time. The "cpu" column is process CPU time /
wall time: 2.0 means both cores were ours; less means other load on the
machine took them, and the rate is low by about that much.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import selectors
import select
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C_SOURCE = os.path.join(ROOT, "bench", "fdcore_bench.c")


# ---------------------------------------------------------------------------
# build and run the C program

def build(core_dir: str, out_dir: str, cc: str = "gcc") -> str:
    exe = os.path.join(out_dir, "fdcore_bench")
    srcs = sorted(glob.glob(os.path.join(core_dir, "*.c")))   # fdcore/*.c, whatever the split
    cmd = [cc, "-O2", "-pthread", "-I", core_dir, *srcs, C_SOURCE, "-o", exe]
    subprocess.run(cmd, check=True)
    return exe


def run_repro(exe: str, secs: float) -> list[dict]:
    """The short reproductions of core bugs found by the stress mode."""
    out = []
    for mode, args in (("repro-takeover", []), ("repro-insert", ["--secs", str(secs)])):
        p = subprocess.run([exe, mode, *args], capture_output=True, text=True, timeout=60)
        for line in p.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                r["cmd"] = shlex.join(["fdcore_bench", mode, *args])
                out.append(r)
    return out


def run_c(exe: str, mode: str, *args: str, timeout: float = 120.0) -> list[dict]:
    cmd = [exe, mode, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode not in (0, 3) or not rows:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    for r in rows:
        r["cmd"] = shlex.join(["fdcore_bench", mode, *args])
        r["stderr"] = p.stderr
    return rows


# ---------------------------------------------------------------------------
# Python-level measurements (through the cffi wrapper) and their peers

def timed_loop(fn, secs: float, batch: int = 1000) -> tuple[int, float]:
    n = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(batch):
            fn()
        n += batch
        el = time.perf_counter() - t0
        if el >= secs:
            return n, el


def cpu_now() -> float:
    r = os.times()
    return r.user + r.system


def py_row(section: str, name: str, threads: int, ops: int, el: float, cpu: float, **extra) -> dict:
    return {"mode": section, "name": name, "threads": threads, "ops": ops, "secs": el,
            "rate": ops / el if el else 0.0, "cpu": cpu / el if el else 0.0, **extra}


def py_enterleave(secs: float) -> list[dict]:
    from sockherd.fdcore import Table
    from sockherd.fdcore._fdcore import ffi, lib

    rows = []
    a, b = socket.socketpair()
    with Table(threads=2, maxfd=65536) as t:
        fd = os.dup(a.fileno())
        t.insert(fd, owner=0x77, thread_mask=0b11)
        th = t.threads[0]

        def wrapped():
            _, gen = th.enter(fd)
            th.leave(fd, gen)

        c0 = cpu_now()
        n, el = timed_loop(wrapped, secs)
        rows.append(py_row("py_enterleave", "Table.enter/leave", 1, n, el, cpu_now() - c0))

        raw_th = th._th
        gp = ffi.new("uint32_t *")
        enter, leave = lib.fdc_enter, lib.fdc_leave

        def direct():
            enter(raw_th, fd, gp)
            leave(raw_th, fd, gp[0])

        c0 = cpu_now()
        n, el = timed_loop(direct, secs)
        rows.append(py_row("py_enterleave", "lib.fdc_enter/leave (cffi, no wrapper)", 1, n, el,
                           cpu_now() - c0))

        # two Python threads on the shared fd (the GIL serialises them)
        counts = [0, 0]
        stop = threading.Event()

        def worker(i):
            thr = t.threads[i]
            k = 0
            while not stop.is_set():
                for _ in range(500):
                    _, g = thr.enter(fd)
                    thr.leave(fd, g)
                k += 500
            counts[i] = k

        ths = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        c0 = cpu_now()
        t0 = time.perf_counter()
        for x in ths:
            x.start()
        time.sleep(secs)
        stop.set()
        for x in ths:
            x.join()
        el = time.perf_counter() - t0
        rows.append(py_row("py_enterleave", "Table.enter/leave, 2 threads, shared fd", 2,
                           sum(counts), el, cpu_now() - c0))
        t.threads[0].delete(fd)
    a.close()
    b.close()
    return rows


def _pingpong(secs: float, wait_a, wait_b, kick_a, kick_b) -> tuple[int, float]:
    """Thread A waits, then kicks B; B waits, then kicks A. Round trips/s."""
    stop = threading.Event()
    counts = [0, 0]

    def side(i, wait, kick_other):
        k = 0
        while not stop.is_set():
            wait()
            kick_other()
            k += 1
        counts[i] = k
        kick_other()

    ta = threading.Thread(target=side, args=(0, wait_a, kick_b))
    tb = threading.Thread(target=side, args=(1, wait_b, kick_a))
    t0 = time.perf_counter()
    ta.start()
    tb.start()
    kick_a()
    time.sleep(secs)
    stop.set()
    kick_a()
    kick_b()
    ta.join()
    tb.join()
    return min(counts), time.perf_counter() - t0


def py_wake(secs: float) -> list[dict]:
    from sockherd.fdcore import Table

    rows = []
    with Table(threads=2, maxfd=65536) as t:
        th0, th1 = t.threads
        c0 = cpu_now()
        n, el = _pingpong(secs, lambda: th0.poll(-1), lambda: th1.poll(-1),
                          lambda: t.wake(0), lambda: t.wake(1))
        rows.append(py_row("py_wake", "Table.poll woken by Table.wake", 2, n, el, cpu_now() - c0))

    efd = [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(2)]

    def peer(label: str, polls) -> None:
        """the pingpong over the two eventfds, thread i waiting in polls[i]()"""
        def waiter(i):
            def w():
                for _ in polls[i]():
                    try:
                        os.eventfd_read(efd[i])
                    except BlockingIOError:
                        pass
            return w

        c0 = cpu_now()
        n, el = _pingpong(secs, waiter(0), waiter(1), lambda: os.eventfd_write(efd[0], 1),
                          lambda: os.eventfd_write(efd[1], 1))
        rows.append(py_row("py_wake", label, 2, n, el, cpu_now() - c0))

    # peer: selectors.EpollSelector + eventfd, the stdlib way
    sels = [selectors.EpollSelector() for _ in range(2)]
    for s, e in zip(sels, efd):
        s.register(e, selectors.EVENT_READ)
    peer("peer: selectors.EpollSelector + eventfd", [s.select for s in sels])
    for s in sels:
        s.close()

    # peer: bare select.epoll + eventfd
    eps = [select.epoll() for _ in range(2)]
    for ep, e in zip(eps, efd):
        ep.register(e, select.EPOLLIN)
    peer("peer: select.epoll + eventfd", [ep.poll for ep in eps])
    for ep in eps:
        ep.close()
    for e in efd:
        os.close(e)
    return rows


def py_events(secs: float, nfds: int) -> list[dict]:
    """Events/s from Python for nfds always-readable socketpairs."""
    from sockherd.fdcore import Table

    rows = []
    pairs = [socket.socketpair() for _ in range(nfds)]
    for a, b in pairs:
        a.setblocking(False)
        b.send(b"x")
    with Table(threads=1, maxfd=65536) as t:
        th = t.threads[0]
        fds = []
        for a, _b in pairs:
            fd = os.dup(a.fileno())
            t.insert(fd, owner=0x99, cloned=True)
            th.want_recv(fd)
            fds.append(fd)

        def core():
            evs = th.poll(0)
            for ev in evs:
                th.leave(ev.fd, ev.gen)
            return len(evs)

        c0 = cpu_now()
        n, el = _count_events(core, secs)
        rows.append(py_row("py_events", f"Table.poll + leave, {nfds} ready fds", 1, n, el,
                           cpu_now() - c0, fds=nfds))

        if hasattr(th, "leave_all"):   # wrapper with fdc_leave_batch (15b5251)
            def core_batch():
                evs = th.poll(0)
                th.leave_all()
                return len(evs)

            c0 = cpu_now()
            n, el = _count_events(core_batch, secs)
            rows.append(py_row("py_events", f"Table.poll + leave_all, {nfds} ready fds", 1, n, el,
                               cpu_now() - c0, fds=nfds))

        from sockherd.fdcore._fdcore import lib

        raw_th, evbuf = th._th, th._events
        fdc_poll, fdc_leave, nmax = lib.fdc_poll, lib.fdc_leave, lib.FDC_EVBATCH

        def direct():
            m = fdc_poll(raw_th, 0, evbuf, nmax)
            for i in range(m):
                e = evbuf[i]
                fdc_leave(raw_th, e.fd, e.gen)
            return m

        c0 = cpu_now()
        n, el = _count_events(direct, secs)
        rows.append(py_row("py_events", f"lib.fdc_poll + fdc_leave (cffi, no wrapper), {nfds} ready fds",
                           1, n, el, cpu_now() - c0, fds=nfds))
        for fd in fds:
            th.delete(fd)

    ep = select.epoll()
    for a, _b in pairs:
        ep.register(a.fileno(), select.EPOLLIN)
    c0 = cpu_now()
    n, el = _count_events(lambda: len(ep.poll(0)), secs)
    rows.append(py_row("py_events", f"peer: select.epoll.poll, {nfds} ready fds", 1, n, el,
                       cpu_now() - c0, fds=nfds))
    ep.close()

    sel = selectors.EpollSelector()
    for a, _b in pairs:
        sel.register(a, selectors.EVENT_READ)
    c0 = cpu_now()
    n, el = _count_events(lambda: len(sel.select(0)), secs)
    rows.append(py_row("py_events", f"peer: selectors.EpollSelector.select, {nfds} ready fds", 1,
                       n, el, cpu_now() - c0, fds=nfds))
    sel.close()
    for a, b in pairs:
        a.close()
        b.close()
    return rows


def _count_events(fn, secs: float) -> tuple[int, float]:
    n = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(100):
            n += fn()
        el = time.perf_counter() - t0
        if el >= secs:
            return n, el


# ---------------------------------------------------------------------------
# the plan of the non-stress run

def c_plan(s: float, ls: float) -> list[tuple[str, list[str]]]:
    S = ["--secs", str(s)]
    L = ["--secs", str(ls)]
    plan = []
    # 1. insert + delete pairs
    for n in (1, 2, 4):
        plan.append(("insdel", ["--threads", str(n), "--variant", "core", *S]))
        plan.append(("insdel", ["--threads", str(n), "--variant", "accepted", *S]))
        plan.append(("insdel", ["--threads", str(n), "--variant", "raw", *S]))
    plan.append(("insdel", ["--threads", "1", "--variant", "disown", *S]))
    plan.append(("insdel", ["--threads", "2", "--variant", "disown", *S]))
    # 2. contended takeover
    for pool in (1, 4, 16):
        plan.append(("takeover", ["--threads", "2", "--pool", str(pool), "--variant", "core", *S]))
    plan.append(("takeover", ["--threads", "4", "--pool", "4", "--variant", "core", *S]))
    for pool in (1, 4):
        plan.append(("takeover", ["--threads", "2", "--pool", str(pool), "--variant", "steal", *S]))
    plan.append(("takeover", ["--threads", "1", "--pool", "4", "--variant", "core", *S]))
    plan.append(("takeover", ["--threads", "2", "--pool", "4", "--variant", "private", *S]))
    plan.append(("atomic", ["--threads", "2", "--pool", "7", "--variant", "shared", *S]))
    plan.append(("atomic", ["--threads", "2", "--pool", "7", "--variant", "private", *S]))
    # 3. enter / leave
    plan.append(("enterleave", ["--threads", "1", "--variant", "core", *S]))
    plan.append(("enterleave", ["--threads", "2", "--variant", "core", *S]))
    plan.append(("enterleave", ["--threads", "2", "--variant", "private", *S]))
    # 4. poller
    plan.append(("wake", ["--variant", "core", *S]))
    plan.append(("wake", ["--variant", "raw", *S]))
    plan.append(("wake", ["--variant", "core", "--same-cpu", *S]))
    plan.append(("wake", ["--variant", "raw", "--same-cpu", *S]))
    for nf in (1, 64):
        plan.append(("events", ["--fds", str(nf), "--variant", "core", *S]))
        plan.append(("events", ["--fds", str(nf), "--variant", "raw", *S]))
    plan.append(("busy", ["--variant", "core", *S]))
    plan.append(("busy", ["--variant", "raw", *S]))
    for excl in ("0", "1"):
        plan.append(("listener", ["--threads", "4", "--clients", "2", "--excl", excl, *L]))
    for excl in ("0", "1"):
        plan.append(("listener", ["--threads", "4", "--clients", "1", "--pace-us", "100",
                                  "--excl", excl, *L]))
    return plan


# peers: (mode, name) of a core row -> (mode, name) of its peer, same threads/params
def fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


def describe(r: dict) -> tuple[str, str, str]:
    """(section, label, notes) of a row."""
    m, n, th = r["mode"], r["name"], r["threads"]
    if m == "insdel":
        what = {"core": "dup + fdc_insert + fdc_delete(close)",
                "accepted": "dup + fdc_insert(ACCEPTED: no probe) + fdc_delete(close)",
                "raw": "peer: dup + close",
                "disown": "fdc_insert + fdc_delete, DISOWN (table only, no syscall)"}[n]
        return "1 insert+delete pairs/s", f"{what}, {th} thr", _notes(r, "insert_errors", "deferred")
    if m == "takeover":
        what = {"core": f"fdc_takeover, pool {r['pool']}",
                "steal": f"fdc_takeover of fds the other thread owns, pool {r['pool']}",
                "private": f"fdc_takeover, own pool of {r['pool']} each (no sharing)"}[n]
        notes = (f"attempts {fmt_rate(r['attempt_rate'])}/s, fail {r['fail_ratio'] * 100:.1f}% "
                 f"(busy {r['busy']}, stale {r['stale']}), bad entries {r['bad_entries']}")
        return "2 takeovers (successes)/s", f"{what}, {th} thr", notes
    if m == "atomic":
        what = ("peer: 7 atomic RMW on ONE shared cache line" if n == "shared"
                else "peer: 7 atomic RMW on a private line each")
        return "2 takeovers (successes)/s", f"{what}, {th} thr", "hardware ceiling, ops = groups of 7 RMW"
    if m == "enterleave":
        what = {"core": "fdc_enter + fdc_leave" + (", shared fd" if th > 1 else ""),
                "private": "fdc_enter + fdc_leave, own fd each"}[n]
        return "3 enter+leave pairs/s", f"{what}, {th} thr", _notes(r, "errors")
    if m == "wake":
        what = ("fdc_poll woken by fdc_wake (ping-pong)" if n == "core"
                else "peer: epoll_wait + eventfd ping-pong")
        where = "both threads on CPU 0" if r.get("same_cpu") else "threads on CPU 0 and 1"
        return "4 poll wake-up round trips/s", f"{what}, {where}", ""
    if m == "events":
        what = (f"fdc_poll + fdc_leave, {r['fds']} ready fds" if n == "core"
                else f"peer: epoll_wait, {r['fds']} ready fds")
        return "4 events delivered/s", what, f"{r['per_poll']:.0f} per poll"
    if m == "busy":
        what = ("fdc_poll + read + cant_recv + leave" if n == "core"
                else "peer: epoll_wait + read")
        return "4 busy socketpair events/s", what + ", writer thread", f"{r['MBps']:.0f} MB/s read"
    if m == "listener":
        pace = f", client pause {r['pace_us']} us" if r["pace_us"] else ", flood"
        what = f"{th} thr share a listener, {n}{pace}, {r['clients']} client thr"
        notes = (f"accept_empty/accepted {r['empty_per_accepted']:.3f}, "
                 f"loops/accepted {r['loops_per_accepted']:.2f}, connect errors {r['connect_errors']}")
        return "4 listener accepted/s", what, notes
    if m.startswith("py_"):
        return {"py_enterleave": "5 Python enter+leave pairs/s",
                "py_wake": "5 Python poll wake-up round trips/s",
                "py_events": "5 Python events delivered/s"}[m], n, ""
    if m == "stress":
        return "6 stress ops/s", f"random ops, {th} thr / {r['groups']} groups, pool {r['pool']}", ""
    return m, n, ""


def _notes(r: dict, *keys: str) -> str:
    bad = [f"{k} {r[k]}" for k in keys if r.get(k)]
    return ", ".join(bad)


PEERS = {
    # (mode, name, threads) -> (mode, name, threads) of the peer
    ("insdel", "core", 1): ("insdel", "raw", 1),
    ("insdel", "core", 2): ("insdel", "raw", 2),
    ("insdel", "core", 4): ("insdel", "raw", 4),
    ("insdel", "accepted", 1): ("insdel", "raw", 1),
    ("insdel", "accepted", 2): ("insdel", "raw", 2),
    ("insdel", "accepted", 4): ("insdel", "raw", 4),
    ("busy", "core", 2): ("busy", "raw", 2),
}


def peer_of(r: dict, rows: list[dict]) -> dict | None:
    key = (r["mode"], r["name"], r["threads"])
    if r["mode"] == "wake" and r["name"] == "core":
        return next((p for p in rows if p["mode"] == "wake" and p["name"] == "raw"
                     and p.get("same_cpu") == r.get("same_cpu")), None)
    if r["mode"] == "events" and r["name"] == "core":
        return next((p for p in rows if p["mode"] == "events" and p["name"] == "raw"
                     and p["fds"] == r["fds"]), None)
    if r["mode"] == "listener" and r["name"] == "exclusive":
        return next((p for p in rows if p["mode"] == "listener" and p["name"] == "shared"
                     and p["pace_us"] == r["pace_us"]), None)
    if r["mode"] == "takeover" and r["name"] in ("core", "steal") and r["threads"] == 2:
        return next((p for p in rows if p["mode"] == "atomic" and p["name"] == "shared"), None)
    if r["mode"] == "enterleave" and r["name"] == "core" and r["threads"] == 2:
        return next((p for p in rows if p["mode"] == "enterleave" and p["name"] == "private"), None)
    if r["mode"].startswith("py_") and not r["name"].startswith("peer"):
        if r["mode"] == "py_enterleave":
            return next((p for p in rows if p["mode"] == "enterleave" and p["name"] == "core"
                         and p["threads"] == r["threads"]), None)
        if r["mode"] == "py_wake":
            return next((p for p in rows if p["mode"] == "py_wake"
                         and p["name"].startswith("peer: selectors")), None)
        if r["mode"] == "py_events":
            return next((p for p in rows if p["mode"] == "py_events" and p.get("fds") == r.get("fds")
                         and p["name"].startswith("peer: select.epoll")), None)
    if key in PEERS:
        pm, pn, pt = PEERS[key]
        return next((p for p in rows if (p["mode"], p["name"], p["threads"]) == (pm, pn, pt)), None)
    return None


def table(rows: list[dict]) -> str:
    out = ["| # | benchmark | rate | cpu | per CPU-s | vs peer | notes |",
           "|---|---|---:|---:|---:|---|---|"]
    for r in rows:
        sec, label, notes = describe(r)
        p = peer_of(r, rows)
        if p:
            _ps, plabel, _pn = describe(p)
            ratio = f"{r['rate'] / p['rate']:.2f}x of {fmt_rate(p['rate'])}/s ({plabel.split(',')[0]})" \
                if p["rate"] else ""
        else:
            ratio = ""
        cpu = r.get("cpu", 0.0)
        per_cpu = fmt_rate(r["rate"] / cpu) if cpu > 0.01 else "-"
        out.append(f"| {sec} | {label} | {fmt_rate(r['rate'])}/s | {cpu:.2f} | {per_cpu} | "
                   f"{ratio} | {notes} |")
    return "\n".join(out)


def core_identity(core_dir: str) -> str:
    """Which fdcore was measured: git HEAD, whether fdcore/ differs from it,
    and a hash of the sources actually compiled (the core changes often)."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(glob.glob(os.path.join(core_dir, "*.[ch]"))):
        try:
            with open(f, "rb") as fh:
                h.update(fh.read())
        except OSError:
            pass
    out = f"fdcore sources: {core_dir} sha256 {h.hexdigest()[:16]}"
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--short", "--", "fdcore"],
                               capture_output=True, text=True).stdout.strip()
        out += f", repo HEAD {head}" + (f", fdcore/ modified: {' '.join(dirty.split())}" if dirty
                                        else ", fdcore/ clean")
    except OSError:
        pass
    return out


def machine() -> str:
    lines = [f"date (UTC): {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}",
             f"nproc: {os.cpu_count()}", f"kernel: {platform.release()}",
             f"python: {platform.python_version()}"]
    try:
        cc = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout
        lines.append("gcc: " + cc.splitlines()[0])
    except OSError:
        pass
    try:
        lines.append("loadavg at start: " + open("/proc/loadavg").read().strip())
    except OSError:
        pass
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--secs", type=float, default=1.0, help="seconds per C mode (default 1)")
    ap.add_argument("--listener-secs", type=float, default=2.0, help="seconds per listener mode")
    ap.add_argument("--py-secs", type=float, default=1.0, help="seconds per Python mode")
    ap.add_argument("--quick", action="store_true", help="0.3 s per mode (smoke run)")
    ap.add_argument("--only", default="", help="comma list of modes to run (e.g. takeover,wake,py)")
    ap.add_argument("--core-dir", default=os.path.join(ROOT, "fdcore"),
                    help="fdcore sources to build against (default: the repo's)")
    ap.add_argument("--keep", help="directory to keep the built binary in")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--stress-ops", type=int, help="run the stress mode to this many ops instead")
    ap.add_argument("--stress-secs", type=float, default=3000.0, help="stress time limit")
    ap.add_argument("--stress-profile", choices=("full", "safe"), default="full",
                    help="full: verbs on random numbers and multi-thread masks; safe: verbs only "
                         "on held fds and single-thread masks (avoids the core bugs in README.md)")
    ap.add_argument("--stress-threads", type=int, default=4)
    ap.add_argument("--stress-groups", type=int, default=2)
    ap.add_argument("--stress-pool", type=int, default=64)
    args = ap.parse_args(argv)

    cmdline = shlex.join([os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT)
                          else sys.executable, os.path.relpath(os.path.abspath(__file__), ROOT),
                          *(argv if argv is not None else sys.argv[1:])])
    print(f"# command: {cmdline}")
    print("# " + machine().replace("\n", "\n# "))
    print("# " + core_identity(args.core_dir))
    sys.stdout.flush()

    tmp = tempfile.mkdtemp(prefix="fdcore_bench.")
    try:
        exe = build(args.core_dir, tmp)
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
            shutil.copy(exe, args.keep)
        rows: list[dict] = []
        if args.stress_ops:
            safe = args.stress_profile == "safe"
            sargs = ["--threads", str(args.stress_threads), "--groups", str(args.stress_groups),
                     "--pool", str(args.stress_pool), "--stress-ops", str(args.stress_ops),
                     "--stress-secs", str(args.stress_secs),
                     "--blind-verbs", "0" if safe else "1", "--shared", "0" if safe else "1"]
            print(f"# stress: fdcore_bench stress {shlex.join(sargs)}", flush=True)
            r = run_c(exe, "stress", *sargs, timeout=args.stress_secs + 120)[0]
            rows.append(r)
            print(table(rows))
            print(f"\nops {r['ops']}  ops/s {r['rate']:.0f}  violations {r['violations']}  "
                  f"hang {r['hang']}  by kind {json.dumps(r.get('by_kind', {}))}")
            for k in ("inserts", "closes", "takeovers", "events", "left_at_end"):
                if k in r:
                    print(f"{k} {r[k]}", end="  ")
            print()
            if r["stderr"].strip():
                print("\nstderr (first 100 lines; at most 10 messages per violation kind):")
                print("\n".join(r["stderr"].splitlines()[:100]))
        else:
            s = 0.3 if args.quick else args.secs
            ls = 0.5 if args.quick else args.listener_secs
            ps = 0.3 if args.quick else args.py_secs
            only = {x for x in args.only.split(",") if x}
            for mode, margs in c_plan(s, ls):
                if only and mode not in only:
                    continue
                rows.extend(run_c(exe, mode, *margs))
            if not only or "py" in only:
                rows.extend(py_enterleave(ps))
                rows.extend(py_wake(ps))
                rows.extend(py_events(ps, 1))
                rows.extend(py_events(ps, 64))
            print(table(rows))
            if not only or "repro" in only:
                print("\n# core bug reproductions (violation 1 = the bug is present):")
                for r in run_repro(exe, min(5.0, 15 * s)):
                    print("#   " + r.pop("cmd") + " -> " + json.dumps(r))
            try:
                print("\n# loadavg at end: " + open("/proc/loadavg").read().strip())
            except OSError:
                pass
        if args.json:
            with open(args.json, "w") as f:
                json.dump([{k: v for k, v in r.items() if k != "stderr"} for r in rows], f, indent=1)
        bad = [r for r in rows if r.get("violations") or r.get("hang")]
        return 1 if bad else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
