#!/usr/bin/env python3
"""asgi_hello: ASGI throughput of `sockherd run --interface asgi` against
uvicorn, granian and gunicorn's own ASGI worker, in the same run (issue 22 §5).

    .venv/bin/python bench/asgi_hello.py [--seconds 8] [--only uvicorn,granian]
        [--apps hello,fastapi] [--loads ka-c50,ka-c200,close-c50] [--rounds 1]
        [--checkout DIR] [--json rows.json]

Apps (bench/apps/), each served by every server with 2 worker processes:

  hello     hello:asgi, raw ASGI 3: 200, text/plain, "Hello, world!" (13 bytes)
  fastapi   fastapi_json:app, a FastAPI endpoint answering GET / with
            {"message":"Hello, world!"} (27 bytes of JSON)

Servers:

  sockherd       sockherd run APP --interface asgi -w 2 --threads 1, from this checkout
                 or --checkout DIR (its .venv/bin/sockherd). A tree without the
                 ASGI adapter (worker/asgi.py) is skipped with a note, and so
                 is the fastapi app when that tree's .venv has no fastapi.
  uvicorn        uvicorn APP --workers 2 --http httptools --loop uvloop
                 --no-access-log
  granian        granian --interface asgi --workers 2 APP (its defaults: loop
                 auto, which takes uvloop when installed)
  gunicorn-asgi  gunicorn -w 2 -k asgi APP: gunicorn's own ASGI worker (since
                 gunicorn 24; 27 here), its defaults: --asgi-loop auto (uvloop
                 when installed) and --http-parser auto (the gunicorn_h1c C
                 parser when installed, as bench/setup_peers.sh does)

Loads (wrk, 2 threads, bench/http_hello.py's, measured by its code): ka-c50 and
ka-c200 keep-alive with 50 and 200 connections; close-c50 one request per
connection (Connection: close), 50 connections. Every server of every app runs
side by side (idle while another is measured); rows are interleaved (for each
app and load, every server), so a drift of the machine hits all alike. Before
each row a probe checks the answer (status 200, the app's body, and for
close-c50 that the server closes).

Per row: req/s, p50/p99, errors, the server tree's CPU seconds and requests per
server CPU-second (the steadier figure on a 2-core box where wrk competes for
the cores), ratios to granian and to uvicorn of the same app, load and round,
and what else the machine ran (`other`, as in http_hello.py: a row disturbed
by other processes is measured again, the least disturbed attempt kept).
Issue 22's aims are printed when sockherd ran: raw hello req/s >= 1.0x granian
and req per CPU-s >= 2x uvicorn; FastAPI req/s >= 1.3x uvicorn.

Exit status: 0; 1 when a sockherd row had errors or a failed probe, or a
server stopped answering; 2 for a set-up problem.
"""
from __future__ import annotations

import os
import subprocess
import time

import benchlib as B
import http_hello as H
import rotations as R

SERVERS = ("sockherd", "uvicorn", "granian", "gunicorn-asgi")
APPS = {
    # name: (the app as the servers name it, the body of its answer to GET /)
    "hello": ("hello:asgi", H.HELLO),
    "fastapi": ("fastapi_json:app", b'{"message":"Hello, world!"}'),
}
LOADS = ("ka-c50", "ka-c200", "close-c50")          # H.LOADS' names


def spec_for(server: str, app: str, checkout: str, tmp: str, apps: dict = APPS):
    """The spec function H.Server takes: argv, readiness, description."""
    target = apps[app][0]
    w = str(H.WORKERS)

    def spec(port: int) -> dict:
        bind = f"127.0.0.1:{port}"
        if server == "sockherd":
            sh = os.path.join(checkout, ".venv", "bin", "sockherd")
            return {"argv": [sh, "run", target, "--interface", "asgi", "-w", w, "--threads", "1",
                             "-b", bind, "--pythonpath", B.APPS,
                             # a control endpoint of its own: other masters run here
                             "--runtime-dir", os.path.join(tmp, f"run-{app}")],
                    "ready": (r"worker \d+\.\d+: ready, pid", H.WORKERS),
                    "desc": f"sockherd run {target} --interface asgi -w {w} --threads 1 "
                            f"({os.path.relpath(checkout, B.ROOT) if checkout != B.ROOT else '.'})"}
        if server == "uvicorn":
            return {"argv": [H.peer_bin("uvicorn"), target, "--app-dir", B.APPS,
                             "--host", "127.0.0.1", "--port", str(port), "--workers", w,
                             "--http", "httptools", "--loop", "uvloop", "--no-access-log"],
                    "ready": (r"Application startup complete", H.WORKERS),
                    "desc": f"uvicorn {target} --workers {w} --http httptools --loop uvloop "
                            "--no-access-log"}
        if server == "granian":
            return {"argv": [H.peer_bin("granian"), "--interface", "asgi", "--workers", w,
                             "--host", "127.0.0.1", "--port", str(port),
                             "--working-dir", B.APPS, target],
                    "ready": (r"Started worker-\d+", H.WORKERS),
                    "desc": f"granian --interface asgi --workers {w} {target}"}
        if server == "gunicorn-asgi":
            return {"argv": [H.peer_bin("gunicorn"), "-w", w, "-k", "asgi", "-b", bind,
                             "--chdir", B.APPS, "--no-control-socket", target],
                    "ready": (r"ASGI server listening on", H.WORKERS),
                    "desc": f"gunicorn -w {w} -k asgi {target}"}
        raise ValueError(server)
    return spec


def sockherd_skip(checkout: str, app: str) -> str:
    """Why sockherd of `checkout` cannot serve `app`, or ''."""
    sh = os.path.join(checkout, ".venv", "bin", "sockherd")
    if not os.path.exists(sh):
        return f"{sh} missing (`sh make.sh test` in that checkout)"
    if not os.path.exists(os.path.join(checkout, "worker", "asgi.py")):
        return (f"{checkout} has no worker/asgi.py: no ASGI adapter in that tree yet (issue 22); "
                "--checkout DIR names a tree that has it")
    if app == "fastapi":
        py = os.path.join(checkout, ".venv", "bin", "python")
        if subprocess.run([py, "-c", "import fastapi"], capture_output=True).returncode:
            return f"no fastapi in {checkout}/.venv (pip install -e '.[test]' there)"
    return ""


def versions() -> str:
    r = subprocess.run([B.PEERS_PY, "-c", "import importlib.metadata as m; print(' '.join("
                        "f'{p}/{m.version(p)}' for p in ('gunicorn','gunicorn_h1c','uvicorn',"
                        "'granian','uvloop','httptools','fastapi','starlette','pydantic')))"],
                       capture_output=True, text=True, timeout=60)
    wrk = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout
    wrk = (wrk.splitlines() or ["?"])[0].split(" Copyright")[0]
    return f"{r.stdout.strip() or r.stderr.strip()[-200:]}; {wrk}"


# ---- report ------------------------------------------------------------------------------------
def split(name: str) -> tuple[str, str]:
    server, app = name.rsplit(".", 1)
    return server, app


def ratio(x, base) -> str:
    return f"{x / base:.2f}" if base else "-"


def print_tables(results: list[dict], rounds: int, apps: dict = APPS) -> None:
    for app in apps:
        for ld in LOADS:
            rs = [r for r in results if split(r["server"])[1] == app and r["load"] == ld]
            if not rs:
                continue
            print(f"\n#### {app} ({apps[app][0]}), {ld}: {H.LOADS[ld][0]} connections, "
                  + ("one request per connection" if ld.startswith("close") else "keep-alive")
                  + "\n")
            rows = []
            for r in rs:
                same = {split(x["server"])[0]: x for x in rs if x["round"] == r["round"]}
                g, u = same.get("granian"), same.get("uvicorn")
                rows.append(([r["round"]] if rounds > 1 else []) + [
                    split(r["server"])[0], f"{r['rps']:,.0f}",
                    ratio(r["rps"], g and g["rps"]), ratio(r["rps"], u and u["rps"]),
                    H.fmt_ms(r["p50"]), H.fmt_ms(r["p99"]),
                    f"{r['status']} / {r['connect']}/{r['read']}/{r['write']}/{r['timeout']}",
                    f"{r['cpu_s']:.2f}", f"{r['cores']:.2f}", f"{r['per_cpu_s']:,.0f}",
                    ratio(r["per_cpu_s"], g and g["per_cpu_s"]),
                    ratio(r["per_cpu_s"], u and u["per_cpu_s"]),
                    f"{r['resp_bytes']:.0f}", "+".join(f"{x:.2f}" for x in r["split"]),
                    f"{r['wrk_cpu']:.2f}", f"{r['box']:.2f}", f"{r['irq']:.2f}",
                    f"{r['other']:.2f}", "; ".join(r["notes"]) or "-"])
            print(B.table((["round"] if rounds > 1 else []) + [
                "server", "req/s", "vs granian", "vs uvicorn", "p50 ms", "p99 ms",
                "errors: non-2xx / conn/read/write/timeout", "server CPU s", "server cores",
                "req per server CPU-s", "vs granian", "vs uvicorn", "resp bytes",
                "CPU s per process (tree order)", "wrk cores", "box busy", "irq", "other",
                "notes"], rows))


def print_aims(results: list[dict]) -> None:
    def mean(server, app, ld, key):
        v = [r[key] for r in results if r["server"] == f"{server}.{app}" and r["load"] == ld]
        return sum(v) / len(v) if v else None

    def verdict(x, base, aim):
        return "-" if x is None or not base else \
            f"{x / base:.2f} ({'met' if x / base >= aim else 'NOT met'})"
    rows = []
    for ld in LOADS:
        if mean("sockherd", "hello", ld, "rps") is not None:
            rows.append([f"hello {ld}",
                         verdict(mean("sockherd", "hello", ld, "rps"),
                                 mean("granian", "hello", ld, "rps"), 1.0) + " vs granian req/s",
                         verdict(mean("sockherd", "hello", ld, "per_cpu_s"),
                                 mean("uvicorn", "hello", ld, "per_cpu_s"), 2.0)
                         + " vs uvicorn req per CPU-s"])
        if mean("sockherd", "fastapi", ld, "rps") is not None:
            rows.append([f"fastapi {ld}",
                         verdict(mean("sockherd", "fastapi", ld, "rps"),
                                 mean("uvicorn", "fastapi", ld, "rps"), 1.3) + " vs uvicorn req/s",
                         "-"])
    if rows:
        print("\n#### Issue 22's aims (sockherd against the same run's peers)\n")
        print(B.table(["app, load", "aim 1", "aim 2"], rows))


# ---- main ----------------------------------------------------------------------------------------
def main(app_table: dict = APPS, doc: str = __doc__,
         title: str = "asgi_hello: ASGI hello and FastAPI JSON, 2 worker processes each",
         extra=None) -> int:
    """The run over the apps of app_table (name: (target, body)); asgi_loop.py
    runs it with its own apps, its own options (extra.add_arguments(ap)) and
    a part of its own printed after the tables (extra.after(args, checkout))."""
    ap = B.arg_parser(doc)
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per row (8)")
    ap.add_argument("--warmup", type=float, default=1.0,
                    help="an uncounted wrk run of the same load before each row (1)")
    ap.add_argument("--only", default=",".join(SERVERS),
                    help="servers (default: all): " + ",".join(SERVERS))
    ap.add_argument("--apps", default=",".join(app_table), help="apps (default: all): "
                    + ",".join(app_table))
    ap.add_argument("--loads", default=",".join(LOADS), help="loads (default: all): "
                    + ",".join(LOADS))
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat every (app, load, server) row, interleaved (1)")
    ap.add_argument("--checkout", default=B.ROOT, metavar="DIR",
                    help="the sockherd tree to measure (its .venv/bin/sockherd); default: this one")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 s rows, 0.5 s warm-up")
    R.add_quiet_arguments(ap, budget=300)
    if extra is not None:
        extra.add_arguments(ap)
    a = ap.parse_args()
    if a.quick:
        a.seconds, a.warmup = 2.0, 0.5
    only = [s for s in a.only.split(",") if s]
    apps = [s for s in a.apps.split(",") if s]
    loads = [s for s in a.loads.split(",") if s]
    for s in only:
        if s not in SERVERS:
            ap.error(f"unknown server {s!r}")
    for s in apps:
        if s not in app_table:
            ap.error(f"unknown app {s!r}")
    for s in loads:
        if s not in LOADS:
            ap.error(f"unknown load {s!r}")
    checkout = os.path.abspath(a.checkout)
    skipped = {}
    for app in apps:
        if "sockherd" in only and (why := sockherd_skip(checkout, app)):
            skipped[app] = why
    R.check_tools(only)
    quiet = H.wait_quiet(a.wait_quiet) if a.wait_quiet > 0 else ""
    head = B.header(title)
    vers = versions()
    results: list[dict] = []
    failures: list[str] = []
    stops: dict[str, str] = {}
    t_start = time.monotonic()
    with B.Procs() as procs, B.tempdir("asgi_hello-") as tmp:
        specs = {f"{s}.{app}": (spec_for(s, app, checkout, tmp, app_table), app_table[app][1])
                 for app in apps for s in only if not (s == "sockherd" and app in skipped)}
        servers, lua = R.start(procs, tmp, specs)
        for rnd in range(1, a.rounds + 1):
            for app in apps:
                for ld in loads:
                    for srv in servers.values():
                        if srv.failed or split(srv.name)[1] != app:
                            continue
                        r = R.row(srv, ld, ld, a, lua, t_start, rnd, failures)
                        if r is not None:
                            results.append(r)
        for srv in servers.values():
            stops[srv.name] = srv.stop()
    elapsed = time.monotonic() - t_start

    print(head)
    if quiet:
        print(f"- {quiet}")
    print(f"- peers: {vers}")
    for app, why in skipped.items():
        print(f"- **sockherd not measured for {app}**: {why}")
    print(f"- wrk: -t {H.WRK_THREADS}, -d {a.seconds:g}s --latency, after an uncounted "
          f"{a.warmup:g} s run of the same load; {a.rounds} round(s), servers side by side, "
          f"rows interleaved; total {elapsed:.0f} s")
    print("- servers:")
    for name, srv in servers.items():
        print(f"  - {name}: `{srv.spec['desc']}`; stop: {stops.get(name, '?')}")
    print("- `other` = box busy - server - wrk - irq: other processes' cores during the row "
          f"(a row with other > {a.max_other:g} was measured again, the least disturbed kept)")
    print_tables(results, a.rounds, app_table)
    print_aims(results)
    if extra is not None:
        extra.after(a, checkout)
    return R.end(results, failures, a)


if __name__ == "__main__":
    B.run_main(main, "asgi_hello")
