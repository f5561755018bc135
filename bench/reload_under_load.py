#!/usr/bin/env python3
"""reload_under_load: failures and stalls while a server is reloaded every
second under full load (issue 9 section 2), sockherd against its peers in
the same run.

    .venv/bin/python bench/reload_under_load.py [--reloads 50] [--upgrade-every 10]
        [--only sockherd,nginx] [--quick] [--json rows.json]

Load (bench/reload_client.c, gcc -O2 into bench/build/; one thread, one epoll
instance, closed loop): --close-conns connections opening a new connection
per request (`Connection: close`), --ka-conns keep-alive connections, and one
long request (3 s) always in flight, on a new connection each time, so one
spans every reload. A keep-alive connection that gets `Connection: close`
reconnects (not a failure: server_close). Failures by kind: refused, reset,
eof (closed before the response was whole), timeout (--timeout s; the long
request 3 s more), non2xx, ka_race (a reused keep-alive connection closed by
the server before any byte of the next response: the idle-close race, a
failure of its own kind), other. Stall: the longest time without any
completed 2xx response. Every long request must be answered 200.

Reloads: one every --interval s, never before the previous one completed
(sockherd: the master logged `reload: generation N serving`, which with
the default reload_probation of 10 s is 10 s after the commit: a HUP during
a probation waits for its end, so a sockherd reload takes that long; a peer: as
many never-seen-before pids as it has worker processes answered; at most
--reload-deadline s, then the reload counts as not completed and the next
one goes). Each server gets the same number of reloads.

  sockherd          sockherd run reload_app:app -w 2 (--threads 1, WSGI); kill -HUP
                    master, every --upgrade-every-th reload kill -USR2 master
                    (upgrade: re-exec in place, then a reload)
  sockherd-t4       the same with --threads 4 (a thread stuck 3 s in /sleep no
                    longer holds the other connections of its worker)
  gunicorn-gthread  gunicorn -w 2 -k gthread --threads 4 reload_app:app; kill -HUP
  gunicorn-sync     gunicorn -w 2 reload_app:app (sync: Connection: close
                    on every response); kill -HUP
  uvicorn           uvicorn reload_app:asgi --workers 2; kill -HUP (uvicorn
                    >= 0.30: replaces the workers one at a time, each new one
                    health-checked before the old one is TERMed and joined;
                    the supervisor does nothing else meanwhile)
  nginx             worker_processes 2, `return 200 "pid=$pid\\n"`; the long
                    request a 30 KB file sent at 10 KB/s (limit_rate);
                    kill -HUP master
  haproxy           haproxy -W (master-worker), nbthread 2, `http-request
                    return status 200 lf-string "pid=%pid\\n"`, the long
                    request a 3 s tarpit answered 200; a stats socket with
                    `expose-fd listeners` so the new worker gets the listeners
                    (seamless reload, -x); kill -USR2 master

Reload -> serving: from the signal to the first response of a process that
had never answered before (the client prints each new pid with its time);
for sockherd also the master's own `ready in X s`.

Takeovers (--takeovers N, default 10; a row of their own, sockherd-takeover):
the first instance runs with `--handoff-socket H`; each takeover starts a new
instance with `--handoff-socket H --takeover H`, which takes the listeners,
starts its workers and, once they are READY, tells the old instance to drain
and exit. A takeover completed: the old instance exited and the new one's
workers answered. Skipped, with a note, when `sockherd run --help` does not
list `--takeover` (`--takeover-after`, the stuck-thread relief, is another
setting).

Exit status: 0; 1 if sockherd had any failure (any kind, ka_race included), a
long request not answered 200, a reload that did not complete or was refused,
or a server died; 2 for a set-up problem. Every process started is killed and
reaped on the way out (process groups); every wait is a poll with a deadline.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

import benchlib as B

WORKERS = 2
KINDS = ("refused", "reset", "eof", "timeout", "non2xx", "ka_race", "other")
ALL = ("sockherd", "gunicorn-gthread", "gunicorn-sync", "uvicorn", "nginx", "haproxy")
EXTRA = ("sockherd-t4", "sockherd-takeover")
LONG_BYTES = 30000            # nginx: 30 KB at 10 KB/s, about 3 s


def peer_bin(name: str) -> str:
    return os.path.join(B.PEERS_VENV, "bin", name)


# ---- servers ---------------------------------------------------------------------------------
def nginx_conf(d: str, port: int) -> str:
    www = os.path.join(d, "www")
    os.makedirs(www, exist_ok=True)
    with open(os.path.join(www, "long.bin"), "wb") as f:
        f.write(b"x" * LONG_BYTES)
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""
daemon off;
master_process on;
worker_processes {WORKERS};
user root;
pid {d}/nginx.pid;
error_log {d}/error.log notice;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port};
        root {www};
        location = / {{ default_type text/plain; return 200 "pid=$pid\\n"; }}
        location = /long.bin {{ limit_rate 10k; }}
    }}
}}
""")
    return conf


def haproxy_conf(d: str, port: int) -> str:
    conf = os.path.join(d, "haproxy.cfg")
    with open(conf, "w") as f:
        f.write(f"""
global
    nbthread 2
    hard-stop-after 30s
    stats socket {d}/admin.sock mode 600 level admin expose-fd listeners
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 75s
    timeout tarpit 3s
frontend fe
    bind 127.0.0.1:{port}
    http-request tarpit deny_status 200 content-type text/plain string "slept\\n" if {{ path /sleep }}
    http-request return status 200 content-type text/plain lf-string "pid=%pid\\n"
""")
    return conf


def server_spec(name: str, port: int, d: str, threads: int) -> dict:
    """argv, the reload signal(s), the long request's path, the number of
    worker processes a reload replaces, a description."""
    bind = f"127.0.0.1:{port}"
    if name in ("sockherd", "sockherd-t4"):
        t = 4 if name == "sockherd-t4" else threads
        return {"argv": [B.SOCKHERD, "run", "reload_app:app", "-w", str(WORKERS), "--threads", str(t),
                         "-b", bind, "--pythonpath", B.APPS],
                "long": "/sleep?3", "procs": WORKERS, "sockherd": True,
                "desc": f"sockherd run reload_app:app -w {WORKERS} --threads {t}; HUP, USR2 (upgrade)"}
    if name.startswith("gunicorn"):
        extra = ["-k", "gthread", "--threads", "4"] if name == "gunicorn-gthread" else []
        return {"argv": [peer_bin("gunicorn"), "-w", str(WORKERS), *extra, "-b", bind,
                         "--chdir", B.APPS, "--no-control-socket", "reload_app:app"],
                "long": "/sleep?3", "procs": WORKERS,
                "desc": f"gunicorn -w {WORKERS} {' '.join(extra)} reload_app:app; HUP"
                .replace("  ", " ")}
    if name == "uvicorn":
        return {"argv": [peer_bin("uvicorn"), "reload_app:asgi", "--app-dir", B.APPS,
                         "--host", "127.0.0.1", "--port", str(port), "--workers", str(WORKERS),
                         "--no-access-log"],
                "long": "/sleep?3", "procs": WORKERS,
                "desc": f"uvicorn reload_app:asgi --workers {WORKERS}; HUP"}
    if name == "nginx":
        conf = nginx_conf(d, port)
        return {"argv": ["nginx", "-p", d, "-c", conf, "-e", os.path.join(d, "error.log")],
                "long": "/long.bin", "procs": WORKERS,
                "desc": f"nginx, worker_processes {WORKERS}, return 200; HUP"}
    if name == "haproxy":
        conf = haproxy_conf(d, port)
        return {"argv": ["haproxy", "-W", "-db", "-f", conf], "long": "/sleep", "procs": 1,
                "reload_sig": signal.SIGUSR2,
                "desc": "haproxy -W, nbthread 2, http-request return 200; USR2"}
    raise ValueError(name)


def versions() -> str:
    out = []
    for argv, pat in (([peer_bin("python"), "-c", "import importlib.metadata as m;"
                        "print(' '.join(p + '==' + m.version(p) for p in "
                        "('gunicorn', 'uvicorn', 'uvloop', 'httptools')))"], r"(.*)"),
                      (["nginx", "-v"], r"nginx version: (\S+)"),
                      (["haproxy", "-v"], r"(HAProxy version \S+)")):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
            m = re.search(pat, r.stdout + r.stderr)
            out.append(m.group(1).strip() if m else "?")
        except (OSError, subprocess.TimeoutExpired):
            out.append(f"{argv[0]}: missing")
    return ", ".join(out)


def has_takeover() -> bool:
    """`sockherd run --help` lists `--takeover` (not just `--takeover-after`)."""
    r = subprocess.run([B.SOCKHERD, "run", "--help"], capture_output=True, text=True, timeout=60)
    return re.search(r"--takeover(?![-\w])", r.stdout) is not None


# ---- the failures ------------------------------------------------------------------------------
def after_signal(fails, signals) -> dict:
    """Each failure's delay since the last reload signal before it: how many
    came within 2 s of one, the longest such delay, the signals followed by
    at least one failure (by signal name)."""
    out = {"within_2s": 0, "later": 0, "max_delay_ms": 0.0, "signals_hit": {}}
    hit = set()
    for _kind, t, _rest in fails:
        prev = [(i, ts, name) for i, (ts, name) in enumerate(signals) if ts <= t]
        if prev and t - prev[-1][1] <= 2.0:
            out["within_2s"] += 1
            out["max_delay_ms"] = max(out["max_delay_ms"], (t - prev[-1][1]) * 1000)
            hit.add((prev[-1][0], prev[-1][2]))
        else:
            out["later"] += 1
    for _i, name in hit:
        out["signals_hit"][name] = out["signals_hit"].get(name, 0) + 1
    return out


# ---- one server ---------------------------------------------------------------------------------
SERVING_RE = re.compile(r"reload: generation (\d+) serving \(ready in ([\d.]+)s[,)]")
REFUSED_RE = re.compile(r"reload refused|upgrade failed|upgrade refused")
BAD_RE = re.compile(r"reload refused|upgrade failed|upgrade refused|failed before ready|"
                    r"gave up|no heartbeat|killed|Traceback|CRITICAL")


def git_state() -> str:
    """HEAD and whether master/ worker/ fdcore/ ipc/ differ from it: each reload
    starts workers (and each upgrade a master) from the sources as they are then."""
    m = B.machine()
    return f"{m['head']} (modified: {m['modified']})"


def end_tree(procs: B.Procs, p: subprocess.Popen) -> None:
    """The server gone whatever happened: TERM (40 s), then its whole group killed."""
    if p.poll() is None:
        procs.stop(p, signal.SIGTERM, timeout=40)
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def run_server(procs: B.Procs, tmp: str, name: str, a) -> dict:
    started: list[subprocess.Popen] = []
    try:
        return _run_server(procs, tmp, name, a, started)
    finally:
        for p in started:
            end_tree(procs, p)


def _run_server(procs: B.Procs, tmp: str, name: str, a, started: list) -> dict:
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    port = B.free_port()
    spec = server_spec(name, port, d, a.threads)
    log = os.path.join(d, "server.log")
    row = {"server": name, "desc": spec["desc"], "reloads": 0, "upgrades": 0, "takeovers": 0,
           "incomplete": 0, "serving_s": [], "ready_s": [], "notes": [], "signals": [],
           "per_reload": [], "git_start": git_state()}
    p = procs.start(spec["argv"], log_path=log, stdout=None, cwd=B.APPS)
    started.append(p)
    text = lambda: B.read_text(log)                                     # noqa: E731

    def answering():
        if p.poll() is not None:
            raise B.BenchError(f"{name} exited with {p.returncode} before serving:\n"
                               + text()[-3000:])
        return B.can_connect(port)
    B.wait_for(answering, 60, f"{name} listening", interval=0.1)
    client = B.ReloadClient(procs, port, a.close_conns, a.ka_conns, spec["long"], a.timeout)
    try:
        # the first generation answers: every worker process, or 10 s
        try:
            B.wait_for(lambda: len(client.pids_since(0)) >= spec["procs"], 10,
                       f"{name}: {spec['procs']} processes answering", interval=0.05)
        except B.BenchError as e:
            row["notes"].append(str(e))
        time.sleep(a.warmup)
        last_sig = 0.0
        is_sockherd = spec.get("sockherd", False)
        for i in range(1, a.reloads + 1):
            upgrade = is_sockherd and a.upgrade_every > 0 and i % a.upgrade_every == 0
            while time.monotonic() < last_sig + a.interval:
                time.sleep(0.01)
            if p.poll() is not None:
                row["notes"].append(f"the master exited ({p.returncode}) before reload {i}")
                break
            served_before = len(SERVING_RE.findall(text())) if is_sockherd else 0
            refused_before = len(REFUSED_RE.findall(text())) if is_sockherd else 0
            t0 = time.monotonic()
            sig = signal.SIGUSR2 if upgrade else spec.get("reload_sig", signal.SIGHUP)
            os.kill(p.pid, sig)
            last_sig = t0
            row["signals"].append((t0, "USR2" if upgrade else sig.name))
            row["upgrades" if upgrade else "reloads"] += 1

            if is_sockherd:
                def done():
                    if p.poll() is not None:
                        raise B.BenchError("the master exited")
                    t = text()
                    if len(SERVING_RE.findall(t)) > served_before:
                        return True
                    refused = [ln for ln in t.splitlines() if REFUSED_RE.search(ln)]
                    if len(refused) > refused_before:
                        raise B.BenchError(f"refused: {refused[-1]}")
                    return None
            else:
                def done():
                    if p.poll() is not None:
                        raise B.BenchError("the master exited")
                    return len(client.pids_since(t0)) >= spec["procs"]
            try:
                B.wait_for(done, a.reload_deadline, f"reload {i} of {name} to complete",
                           interval=0.01)
            except B.BenchError as e:
                row["incomplete"] += 1
                row["notes"].append(f"reload {i} ({'USR2' if upgrade else sig.name}): {e}")
                if p.poll() is not None:
                    break
            # reload -> serving: the first answer of a never-seen pid after t0
            # (waited for a little longer than the completion, at most 5 s)
            rec = {"i": i, "sig": "USR2" if upgrade else sig.name, "serving_s": None,
                   "ready_s": None}
            try:
                first = B.wait_for(lambda: client.pids_since(t0), 5, "a new pid answering",
                                   interval=0.01)
                rec["serving_s"] = first[0][1] - t0
                row["serving_s"].append(rec["serving_s"])
            except B.BenchError:
                row["notes"].append(f"reload {i}: no new process answered within 5 s")
            if is_sockherd:
                m = SERVING_RE.findall(text())
                if len(m) > served_before:
                    rec["ready_s"] = float(m[-1][1])
                    row["ready_s"].append(rec["ready_s"])
            row["per_reload"].append(rec)
        # let the last long request (which spans the last reload) finish
        time.sleep(a.settle)
        res = client.stop()
    finally:
        if client.p.poll() is None:
            client.p.kill()
    only_new(row, client)
    row["alive"] = p.poll() is None
    row["git_end"] = git_state()
    if not row["alive"]:
        row["notes"].append(f"the master exited with {p.returncode}")
    row.update(res)
    row["failures"] = sum(res[k] for k in KINDS)
    row["long_bad"] = res["long_total"] - res["ok_long"]
    row["fail_lines"] = client.fails[:2000]
    row["fail_after_signal"] = after_signal(client.fails, row["signals"])
    stop = procs.stop(p, signal.SIGTERM, timeout=40)
    if stop is None:
        row["notes"].append("did not exit within 40 s of TERM (killed)")
    t = text()
    if spec.get("sockherd"):
        bad = [ln for ln in t.splitlines() if BAD_RE.search(ln)]
        row["log_bad"] = bad[:20]
        row["reload_refused"] = sum(bool(REFUSED_RE.search(ln)) for ln in bad)
    row["log_tail"] = t.splitlines()[-30:]
    return row


def run_takeovers(procs: B.Procs, tmp: str, a) -> dict:
    """sockherd-takeover: N live hand-offs, each to a new instance started with
    `--handoff-socket H --takeover H` (H: the hand-off socket of the one serving);
    the new one tells the old one to drain and exit once its workers are READY."""
    d = os.path.join(tmp, "sockherd-takeover")
    os.makedirs(d, exist_ok=True)
    port = B.free_port()
    spec = server_spec("sockherd", port, d, a.threads)
    handoff = os.path.join(d, "handoff.sock")
    argv = spec["argv"] + ["--handoff-socket", handoff]
    row = {"server": "sockherd-takeover", "reloads": 0, "upgrades": 0, "takeovers": 0,
           "desc": f"{' '.join(spec['desc'].split(';')[0].split())} --handoff-socket H; a new "
                   "instance with --handoff-socket H --takeover H",
           "incomplete": 0, "serving_s": [], "ready_s": [], "notes": [], "signals": [],
           "per_reload": [], "git_start": git_state()}
    offering = r"hand-off socket .*: a new instance may take the listeners over"
    logs = [os.path.join(d, "server0.log")]
    cur = procs.start(argv, log_path=logs[0], cwd=B.APPS)
    started = [cur]
    client = None
    try:
        B.wait_sockherd_ready(cur, logs[0], WORKERS, timeout=60)
        client = B.ReloadClient(procs, port, a.close_conns, a.ka_conns, spec["long"], a.timeout)
        time.sleep(a.warmup)
        last = 0.0
        for i in range(1, a.takeovers + 1):
            while time.monotonic() < last + a.interval:
                time.sleep(0.01)
            log_cur = logs[-1]
            try:
                B.wait_for(lambda: re.search(offering, B.read_text(log_cur)), 10,
                           "the serving instance to offer its hand-off socket")
            except B.BenchError as e:
                row["notes"].append(f"takeover {i}: {e}")
                break
            logs.append(os.path.join(d, f"server{i}.log"))
            t0 = last = time.monotonic()
            new = procs.start(argv + ["--takeover", handoff], log_path=logs[-1], cwd=B.APPS)
            started.append(new)
            row["takeovers"] += 1
            row["signals"].append((t0, "takeover"))
            rec = {"i": i, "sig": "takeover", "serving_s": None, "old_exit_s": None}
            log_new = logs[-1]

            def done():
                if new.poll() is not None:
                    raise B.BenchError(f"the new instance exited with {new.returncode}")
                return (cur.poll() is not None and "takeover: serving" in B.read_text(log_new)
                        and len(client.pids_since(t0)) >= WORKERS)
            try:
                B.wait_for(done, a.reload_deadline, f"takeover {i} to complete", interval=0.01)
                rec["old_exit_s"] = time.monotonic() - t0
                if cur.returncode != 0:
                    row["notes"].append(f"takeover {i}: the old instance exited with "
                                        f"{cur.returncode}")
            except B.BenchError as e:
                row["incomplete"] += 1
                row["notes"].append(f"{e}: " + " | ".join(B.read_text(log_new).splitlines()[-5:]))
                if new.poll() is not None:
                    break
                end_tree(procs, cur)                  # the old one, never told: ours to stop
            got = client.pids_since(t0)
            if got:
                rec["serving_s"] = got[0][1] - t0
                row["serving_s"].append(rec["serving_s"])
            row["per_reload"].append(rec)
            cur = new
        time.sleep(a.settle)
        res = client.stop()
    finally:
        if client is not None and client.p.poll() is None:
            client.p.kill()
        alive = cur.poll() is None
        for p in started:
            end_tree(procs, p)
    only_new(row, client)
    row["alive"] = alive
    row["git_end"] = git_state()
    row.update(res)
    row["failures"] = sum(res[k] for k in KINDS)
    row["long_bad"] = res["long_total"] - res["ok_long"]
    row["fail_lines"] = client.fails[:2000]
    row["fail_after_signal"] = after_signal(client.fails, row["signals"])
    bad = [ln for lg in logs for ln in B.read_text(lg).splitlines() if BAD_RE.search(ln)]
    row["log_bad"] = bad[:20]
    row["reload_refused"] = len(bad)
    row["log_tail"] = B.read_text(logs[-1]).splitlines()[-30:]
    return row


def only_new(row: dict, client) -> None:
    """Each reload's `only_new_s`: from its signal to the latest new
    connection (its connect() began) whose first request a process that
    answered before the signal still answered: every connection made
    after it got new code (0: none after the signal). And
    `only_new_any_s`, the same over every request, a kept-alive
    connection's next one too (its client may send one more on a
    connection of the old generation before it reads Connection: close).
    The long request is left out: finishing one begun before is what a
    graceful reload owes."""
    first = dict(client.newpids)                      # pid -> when it first answered
    for rec, (t0, _sig) in zip(row["per_reload"], row["signals"]):
        olds = [pid for pid, t in first.items() if t < t0]
        for key, last in (("only_new_s", client.lastconn), ("only_new_any_s", client.lastsent)):
            rec[key] = max((last[p] - t0 for p in olds if last.get(p, 0.0) >= t0),
                           default=0.0)


# ---- report -----------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def ms(x) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def by_signal(r: dict, key: str) -> str:
    """p50/max in ms of a per-reload figure, by signal (HUP; USR2; takeover)."""
    groups: dict[str, list[float]] = {}
    for rec in r.get("per_reload", []):
        if rec.get(key) is not None:
            groups.setdefault(rec["sig"].replace("SIG", ""), []).append(rec[key])
    if not groups:
        return "-"
    if len(groups) == 1 and not r["server"].startswith("sockherd"):
        xs = next(iter(groups.values()))
        return f"{ms(pct(xs, 0.5))}/{ms(max(xs))}"
    return "; ".join(f"{k} {ms(pct(xs, 0.5))}/{ms(max(xs))}" for k, xs in groups.items())


def report(rows: list[dict], a, notes: list[str], head: str) -> str:
    out = [head,
           f"- peers: {versions()}",
           f"- load: {a.close_conns} connection-per-request + {a.ka_conns} keep-alive "
           f"connections (closed loop, bench/reload_client.c) + 1 long request always in "
           f"flight; timeout {a.timeout:g} s; a reload every {a.interval:g} s at the earliest, "
           f"after the previous one completed; sockherd: every {a.upgrade_every}th is an "
           f"upgrade (USR2)"]
    out += [f"- {n}" for n in notes]
    out.append("")
    heads = ["server", "reloads (upgrades)", "requests ok", "failures", *KINDS, "per million",
             "longest stall ms", "long ok/total", "reload->serving ms p50/max",
             "reload->new connections only new code ms p50/max",
             "reload->every request new code ms p50/max", "ready in (log) ms p50/max", "incomplete",
             "server_close"]
    body = []
    for r in rows:
        if "ok" not in r:
            body.append([r["server"], "-", "-", "ERROR", *["-"] * len(KINDS), "-", "-", "-",
                         "-", "-", "-", "-", "-", "-"])
            continue
        n = r["reloads"] + r["upgrades"] + r["takeovers"]
        rel = f"{n} ({r['upgrades']})" if r["upgrades"] else (
            f"{n} takeovers" if r["takeovers"] else str(n))
        total = r["ok"] + r["failures"]
        body.append([
            r["server"], rel, r["ok"], r["failures"], *[r[k] for k in KINDS],
            f"{r['failures'] * 1e6 / total:.1f}" if total else "-",
            f"{r['max_stall_us'] / 1000:.0f}", f"{r['ok_long']}/{r['long_total']}",
            by_signal(r, "serving_s"), by_signal(r, "only_new_s"), by_signal(r, "only_new_any_s"),
            by_signal(r, "ready_s"),
            r["incomplete"], r["server_close"]])
    out.append(B.table(heads, body))
    out.append("")
    out.append("Commands: " + "; ".join(f"{r['server']}: `{r['desc']}`" for r in rows))
    out.append("")
    out.append("Per row: requests ok = 2xx responses (connection-per-request / keep-alive / long); "
               "per million = failures per million requests attempted; longest stall = longest "
               "time with no 2xx response completed; reload->serving = signal to the first "
               "answer of a new process; reload->new connections only new code = signal to the latest "
               "connection made (connect() began) whose first request an old process answered "
               "(every connection made later got new code); reload->every request new code = "
               "the same over every request, a kept-alive connection's next ones too (the long "
               "request left out in both); ready in = sockherd master's `reload: generation N "
               "serving (ready in X s)`; incomplete = reloads not completed within the "
               "deadline; server_close = keep-alive connections the server ended with "
               "`Connection: close` (not failures).")
    out.append("")
    for r in rows:
        extra = []
        if "ok" in r:
            extra.append(f"ok close/ka/long {r['ok_close']}/{r['ok_ka']}/{r['ok_long']}, "
                         f"connects {r['connects']}, slowest non-long response "
                         f"{r['max_lat_us'] / 1000:.0f} ms")
        if "git_start" in r and r["server"].startswith("sockherd"):
            extra.append(f"sockherd git {r['git_start']}" + (
                "" if r.get("git_end") in (None, r["git_start"]) else
                f" at the start, {r['git_end']} at the end: the sources changed during the row"))
        olds = [x["old_exit_s"] for x in r.get("per_reload", []) if x.get("old_exit_s")]
        if olds:
            extra.append(f"takeover -> old instance exited: p50 {ms(pct(olds, 0.5))} ms, "
                         f"max {ms(max(olds))} ms (it drains: the long request finishes)")
        extra += r["notes"]
        if r.get("log_bad"):
            extra.append("log lines: " + " / ".join(f"`{x}`" for x in r["log_bad"][:8]))
        fa = r.get("fail_after_signal")
        if fa and (fa["within_2s"] or fa["later"]):
            hits = ", ".join(f"{v} {k}" for k, v in fa["signals_hit"].items())
            extra.append(f"{fa['within_2s']} failures within 2 s of a signal (at most "
                         f"{fa['max_delay_ms']:.0f} ms after it; signals followed by a failure: "
                         f"{hits or 'none'}), {fa['later']} later")
        if r.get("fail_lines"):
            by = {}
            for kind, t, rest in r["fail_lines"]:
                by.setdefault(kind, []).append(rest)
            extra.append("first failures (type served-on-conn bytes errno): " + "; ".join(
                f"{k}: " + ", ".join(v[:3]) for k, v in by.items()))
        if extra:
            out.append(f"- **{r['server']}**: " + "; ".join(extra))
    out.append(B.footer())
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help=f"comma-separated servers, of {', '.join(ALL + EXTRA)}"
                    " (default: all but sockherd-t4; sockherd-takeover when --takeovers > 0 "
                    "and sockherd has --takeover)")
    ap.add_argument("--reloads", type=int, default=50, help="reloads per server (sockherd: "
                    "HUP and USR2 together)")
    ap.add_argument("--upgrade-every", type=int, default=10,
                    help="sockherd: every Nth reload is an upgrade (USR2); 0: none")
    ap.add_argument("--takeovers", type=int, default=10,
                    help="sockherd instance-to-instance takeovers, a row of their own (needs "
                         "`sockherd run --takeover`; skipped with a note otherwise); 0: none")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between reloads (at "
                    "least; never before the previous reload completed)")
    ap.add_argument("--reload-deadline", type=float, default=30.0)
    ap.add_argument("--close-conns", type=int, default=4)
    ap.add_argument("--ka-conns", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=10.0, help="per request (s); the long "
                    "request gets 3 s more")
    ap.add_argument("--threads", type=int, default=1, help="sockherd -t (the sockherd row)")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--settle", type=float, default=4.0, help="seconds of load after the last "
                    "reload (the long request in flight finishes)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 10 reloads (sockherd: "
                    "2 of them upgrades)")
    ap.add_argument("--json", help="write the rows to this file")
    a = ap.parse_args()
    if a.quick:
        a.reloads, a.upgrade_every, a.takeovers = 10, 5, min(a.takeovers, 3)
    names = a.only.split(",") if a.only else list(ALL)
    for n in names:
        if n not in ALL + EXTRA:
            ap.error(f"unknown server {n}")
    try:
        B.check_sockherd()
        B.check_peers_venv()
        B.build_c("reload_client")
    except (B.BenchError, subprocess.CalledProcessError) as e:
        print(f"set-up: {e}", file=sys.stderr)
        return 2
    head = B.header("reload_under_load: reloads under full load (issue 9 §2)")
    notes = ["the box is shared (2 cores; tests may run meanwhile): throughput is noisy, "
             "failure counts are not"]
    do_takeover = False
    if a.takeovers:
        if has_takeover():
            do_takeover = True
        else:
            notes.append("takeovers skipped: `sockherd run --help` does not list `--takeover` "
                         "(only `--takeover-after`, the stuck-thread relief)")
    rows = []
    with B.tempdir("reload-bench-") as tmp, B.Procs() as procs:
        os.chmod(tmp, 0o755)
        for n in names:
            if n == "sockherd-takeover":
                continue
            if n in ("nginx", "haproxy") and subprocess.run(
                    ["sh", "-c", f"command -v {n}"], capture_output=True).returncode:
                rows.append({"server": n, "notes": [f"{n} missing: sh bench/setup_peers.sh"]})
                continue
            print(f"reload_under_load: {n} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            try:
                rows.append(run_server(procs, tmp, n, a))
            except (B.BenchError, OSError, subprocess.SubprocessError) as e:
                rows.append({"server": n, "notes": [f"ERROR: {e}"]})
            r = rows[-1]
            print(f"reload_under_load: {n}: {time.monotonic() - t0:.0f} s, ok={r.get('ok')} "
                  f"failures={r.get('failures')}", file=sys.stderr, flush=True)
        if do_takeover and (not a.only or "sockherd-takeover" in names):
            print("reload_under_load: sockherd-takeover ...", file=sys.stderr, flush=True)
            try:
                rows.append(run_takeovers(procs, tmp, a))
            except (B.BenchError, OSError, subprocess.SubprocessError) as e:
                rows.append({"server": "sockherd-takeover", "notes": [f"ERROR: {e}"]})
    print(report(rows, a, notes, head))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "notes": notes, "rows": rows}, f, indent=1)
    bad = False
    for r in rows:
        if not r["server"].startswith("sockherd"):
            continue
        if ("ok" not in r or r["failures"] or r["long_bad"] or r["incomplete"]
                or r.get("reload_refused") or not r.get("alive", False)):
            bad = True
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
