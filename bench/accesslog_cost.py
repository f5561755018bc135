#!/usr/bin/env python3
"""accesslog_cost: what an access log written to a file costs sockherd, gunicorn
and granian serving hello world, in the same run (issue 24 §4).

    .venv/bin/python bench/accesslog_cost.py [--seconds 6] [--rounds 3] [--only a,b]
        [--loads ka-c50,close-c50] [--wait-quiet S] [--checkout DIR] [--json rows.json]

Servers, 2 worker processes each, bench/apps/hello.py (WSGI), plain HTTP, each
server's default access-log format, the log to a file in a temporary directory:

  sockherd-off      sockherd run hello:app -w 2 --threads 1
  sockherd-text     the same, --access-logfile F (the default format, gunicorn's
                    atoms: h - - t "r" s b "f" "a" L)
  sockherd-json     the same, --access-logfile F --log-format json
  gunicorn-off      gunicorn -w 2 -k gthread --threads 4 hello:app
  gunicorn-on       the same, --access-logfile F (gunicorn's default format:
                    h l u t "r" s b "f" "a")
  granian-off       granian --interface wsgi --workers 2 hello:app
  granian-on        the same, --access-log --log-config C, C sending the
                    granian.access logger to a logging.FileHandler on F (its
                    default format: [time] addr - "method path protocol" status
                    dt_ms); without a config its lines go to stdout

Loads (wrk -t2, http_hello.py's): ka-c50 keep-alive, 50 connections (default);
close-c50 one request per connection.

Reported, per server over the rounds (bench/rotations.py: the servers' order
turned by one each round, medians and ranges, ratios paired within a round):
req/s and requests per server CPU-second; on/off of the same server; and
sockherd's log-on rows against the peers' log-on rows. At the end, the lines
each access log holds against the requests the rows counted (warm-ups and
probes add a few more): a server that does not write its lines costs nothing.

Exit status: 0; 1 when a sockherd row had errors or a failed probe, or a
server stopped answering; 2 for a set-up problem.
"""
from __future__ import annotations

import json
import os
import time

import benchlib as B
import http_hello as H
import rotations as R

SERVERS = ("sockherd-off", "sockherd-text", "sockherd-json", "gunicorn-off", "gunicorn-on",
           "granian-off", "granian-on")
BASES = {"sockherd-text": "sockherd-off", "sockherd-json": "sockherd-off",
         "gunicorn-on": "gunicorn-off", "granian-on": "granian-off"}
CROSS = [("sockherd-text", "gunicorn-on"), ("sockherd-text", "granian-on"),
         ("sockherd-json", "gunicorn-on"), ("sockherd-json", "granian-on")]


def granian_log_config(tmp: str, logfile: str) -> str:
    """granian's own logging config (granian/log.py) with the access logger's
    handler a FileHandler; granian updates its default with this dict's keys,
    so the handlers and loggers are given whole."""
    cfg = {"version": 1, "disable_existing_loggers": False,
           "formatters": {"generic": {"()": "logging.Formatter",
                                      "fmt": "[%(levelname)s] %(message)s"},
                          "access": {"()": "logging.Formatter", "fmt": "%(message)s"}},
           "handlers": {"console": {"formatter": "generic", "class": "logging.StreamHandler",
                                    "stream": "ext://sys.stdout"},
                        "access": {"formatter": "access", "class": "logging.FileHandler",
                                   "filename": logfile}},
           "loggers": {"_granian": {"handlers": ["console"], "level": "INFO",
                                    "propagate": False},
                       "granian.access": {"handlers": ["access"], "level": "INFO",
                                          "propagate": False}}}
    path = os.path.join(tmp, "granian-log.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def spec_for(server: str, checkout: str, tmp: str, logfile: str):
    w = str(H.WORKERS)

    def spec(port: int) -> dict:
        bind = f"127.0.0.1:{port}"
        if server.startswith("sockherd"):
            sh = os.path.join(checkout, ".venv", "bin", "sockherd")
            log = {"sockherd-off": [], "sockherd-text": ["--access-logfile", logfile],
                   "sockherd-json": ["--access-logfile", logfile, "--log-format", "json"]}[server]
            return {"argv": [sh, "run", "hello:app", "-w", w, "--threads", "1", "-b", bind,
                             "--pythonpath", B.APPS, *log,
                             "--runtime-dir", os.path.join(tmp, f"run-{server}")],
                    "ready": (r"worker \d+\.\d+: ready, pid", H.WORKERS),
                    "desc": " ".join(["sockherd run hello:app -w", w, "-t 1",
                                      *(a if a != logfile else "F" for a in log)])}
        if server.startswith("gunicorn"):
            log = ["--access-logfile", logfile] if server == "gunicorn-on" else []
            return {"argv": [H.peer_bin("gunicorn"), "-w", w, "-k", "gthread", "--threads", "4",
                             "-b", bind, *log, "--chdir", B.APPS, "--no-control-socket",
                             "hello:app"],
                    "ready": (r"Booting worker with pid", H.WORKERS),
                    "desc": f"gunicorn -w {w} -k gthread --threads 4 "
                            + ("--access-logfile F " if log else "") + "hello:app"}
        if server.startswith("granian"):
            log = (["--access-log", "--log-config", granian_log_config(tmp, logfile)]
                   if server == "granian-on" else [])
            return {"argv": [H.peer_bin("granian"), "--interface", "wsgi", "--workers", w,
                             "--host", "127.0.0.1", "--port", str(port), *log,
                             "--working-dir", B.APPS, "hello:app"],
                    "ready": (r"Started worker-\d+", H.WORKERS),
                    "desc": f"granian --interface wsgi --workers {w} "
                            + ("--access-log --log-config C " if log else "") + "hello:app"}
        raise ValueError(server)
    return spec


def cross_table(results: list[dict], loads) -> str:
    rows = []
    for ld in loads:
        for a_, b_ in CROSS:
            rps = R.paired(results, a_, b_, ld, "rps")
            eff = R.paired(results, a_, b_, ld, "per_cpu_s")
            if rps:
                rows.append([ld, f"{a_} / {b_}", R.span(rps, "{:.2f}"), R.span(eff, "{:.2f}")])
    return B.table(["load", "rows", "req/s, paired per round", "req per server CPU-s, paired"],
                   rows)


def extra_cpu(results: list[dict], loads) -> str:
    """What the log adds to the server's CPU per request: the log-on row's
    server CPU µs per request minus the log-off row's, paired per round."""
    rows = []
    for ld in loads:
        for on, off in BASES.items():
            d = []
            for r in results:
                if r["server"] != on or r["load"] != ld or not r["requests"]:
                    continue
                b = [x for x in results if x["server"] == off and x["load"] == ld
                     and x["round"] == r["round"] and x["requests"]]
                if b:
                    d.append((r["cpu_s"] / r["requests"] - b[0]["cpu_s"] / b[0]["requests"]) * 1e6)
            if d:
                rows.append([ld, on, R.span(d, "{:.0f}")])
    return B.table(["load", "server", "log's extra server CPU µs per request, paired per round"],
                   rows)


def count_lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return -1


def main() -> int:
    ap = R.parser(__doc__, SERVERS)
    ap.add_argument("--loads", default="ka-c50", help="loads: ka-c50 (default), close-c50")
    a = ap.parse_args()
    only = R.chosen(ap, a, SERVERS)
    loads = {}
    for ld in (x for x in a.loads.split(",") if x):
        if ld not in ("ka-c50", "close-c50"):
            ap.error(f"unknown load {ld!r}")
        loads[ld] = (ld, None)
    checkout = os.path.abspath(a.checkout)
    if any(s.startswith("sockherd") for s in only) and \
            not os.path.exists(os.path.join(checkout, ".venv", "bin", "sockherd")):
        raise B.BenchError(f"{checkout}/.venv/bin/sockherd missing (`sh make.sh test` there)")
    R.check_tools(only)
    quiet = H.wait_quiet(a.wait_quiet) if a.wait_quiet > 0 else ""
    head = B.header("accesslog_cost: hello world with the access log on and off, "
                    "2 worker processes each")
    load0 = R.loadavg()
    vers = H.versions()
    t_start = time.monotonic()
    stops, lines, samples = {}, {}, {}
    with B.Procs() as procs, B.tempdir("accesslog_cost-") as tmp:
        logs = {s: os.path.join(tmp, f"{s}.access.log") for s in only}
        specs = {s: (spec_for(s, checkout, tmp, logs[s]), H.HELLO) for s in only}
        servers, results, failures = R.run(procs, tmp, specs, loads, a, t_start)
        for name, srv in servers.items():
            stops[name] = srv.stop()
            lines[name] = count_lines(logs[name])
            if lines[name] > 0:
                with open(logs[name], "rb") as f:
                    samples[name] = f.readline().decode("utf-8", "replace").strip()
    elapsed = time.monotonic() - t_start

    R.print_head(head, quiet, load0, vers, a, elapsed)
    print("- servers:")
    for name, srv in servers.items():
        print(f"  - {name}: `{srv.spec['desc']}`; stop: {stops.get(name, '?')}")
    names = list(servers)
    for ld in loads:
        print(f"\n#### {ld}: log on / off of the same server\n")
        print(R.summary(results, ld, BASES, names))
    print("\n#### sockherd's log-on rows against the peers' log-on rows\n")
    print(cross_table(results, loads))
    print("\n#### What the log adds to the server's CPU per request\n")
    print(extra_cpu(results, loads))
    print("\n#### Lines in each access log against the requests of the rows kept (warm-ups, "
          "probes and re-measured attempts add more)\n")
    rows = []
    for name in names:
        counted = sum(r["requests"] for r in results if r["server"] == name)
        rows.append([name, f"{lines.get(name, -1):,}" if lines.get(name, -1) >= 0 else "no file",
                     f"{counted:,}", f"`{samples[name][:160]}`" if name in samples else "-"])
    print(B.table(["server", "lines", "requests in the rows", "first line"], rows))
    return R.finish(results, failures, loads, a)


if __name__ == "__main__":
    B.run_main(main, "accesslog_cost")
