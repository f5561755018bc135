#!/usr/bin/env python3
"""asgi_app_cost: instructions an ASGI app itself costs per request, with no
server at all (a zero-cost server's floor), counted by callgrind: the bound
of issue 22 §5's "FastAPI >= 1.3x uvicorn" (bench/RESULTS.md).

    .venv/bin/python bench/asgi_app_cost.py [--app fastapi] [--requests 2000]
        [--warmup 300] [--python PY]

The app (http_callgrind.py's --app names) is imported in one process and
called in process by a minimal driver: one coroutine, running in an
asyncio loop, that awaits app(scope, receive, send) request after request
(no task, no loop iteration, no parsing, no socket per request). The
scope is a fresh dict per request as a server makes it (uvicorn's keys:
a GET / with one Host header); receive gives one http.request with an
empty body; send keeps the messages, and every answer is checked (status
200, the app's body).

Counted as a difference, so the process's start and import cost nothing:
the same driver runs twice under `valgrind --tool=callgrind` (PYTHONHASHSEED
=0), with --warmup requests uncounted and then R or R + --requests
requests; Ir per request = (Ir(R + N) - Ir(R)) / N. --python: the
interpreter whose packages serve the app (default bench/.venv-peers', the
uvicorn run's; this checkout's .venv has the same FastAPI).

--timed N (no valgrind; what asgi_bound.py runs): after --warmup requests,
N requests timed by the process's own CPU clock (os.times: user and sys),
pinned to --cpu C when given; one JSON line on stdout.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

APPS = {
    # --app: (module, attribute, the body of its answer to GET /)
    "asgi-hello": ("hello", "asgi", b"Hello, world!"),
    "fastapi": ("fastapi_json", "app", b'{"message":"Hello, world!"}'),
}

SCOPE_ASGI = {"version": "3.0", "spec_version": "2.4"}


def drive(app, n: int, body: bytes) -> None:
    """n requests of the app, awaited one after another by one coroutine."""
    sent: list = []
    request = {"type": "http.request", "body": b"", "more_body": False}

    async def receive():
        return dict(request)              # a fresh dict per message: apps may mutate it

    async def send(msg):
        sent.append(msg)

    async def run():
        for _ in range(n):
            scope = {"type": "http", "asgi": dict(SCOPE_ASGI), "http_version": "1.1",
                     "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
                     "scheme": "http", "method": "GET", "root_path": "", "path": "/",
                     "raw_path": b"/", "query_string": b"",
                     "headers": [(b"host", b"127.0.0.1:8000")], "state": {}}
            await app(scope, receive, send)
            if (len(sent) != 2 or sent[0].get("status") != 200
                    or sent[1].get("body") != body):
                raise SystemExit(f"unexpected answer {sent!r:.200}")
            sent.clear()

    asyncio.run(run())


def inner(a) -> int:
    sys.path.insert(0, os.path.join(HERE, "apps"))
    mod, attr, body = APPS[a.app]
    app = getattr(__import__(mod), attr)
    drive(app, a.warmup, body)
    drive(app, a.inner, body)
    return 0


def timed(a) -> int:
    """--timed N: the CPU seconds (user, sys) and wall seconds of N requests
    after the warm-up, as one JSON line."""
    import json
    import time
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
    sys.path.insert(0, os.path.join(HERE, "apps"))
    mod, attr, body = APPS[a.app]
    app = getattr(__import__(mod), attr)
    drive(app, a.warmup, body)
    t0, w0 = os.times(), time.monotonic()
    drive(app, a.timed, body)
    t1, w1 = os.times(), time.monotonic()
    print(json.dumps({"requests": a.timed, "user_s": t1.user - t0.user,
                      "sys_s": t1.system - t0.system, "wall_s": w1 - w0, "cpu": a.cpu,
                      "python": sys.executable}))
    return 0


def total_ir(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"{path}: no totals line")


def counted(a, n: int, tmp: str) -> int:
    out = os.path.join(tmp, f"cg-{a.app}-{n}.out")
    env = dict(os.environ, PYTHONHASHSEED="0")
    subprocess.run(["nice", "-n", "19", "valgrind", "--tool=callgrind",
                    f"--callgrind-out-file={out}", a.python, os.path.abspath(__file__),
                    "--app", a.app, "--warmup", str(a.warmup), "--inner", str(n)],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return total_ir(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", choices=list(APPS), default="fastapi")
    ap.add_argument("--requests", type=int, default=2000, help="requests counted (2000)")
    ap.add_argument("--warmup", type=int, default=300, help="requests uncounted first (300)")
    ap.add_argument("--base", type=int, default=100,
                    help="R: the counted run's requests minus --requests (100)")
    ap.add_argument("--python", default=os.path.join(HERE, ".venv-peers", "bin", "python"))
    ap.add_argument("--keep", metavar="DIR", help="write the two dumps to DIR")
    ap.add_argument("--timed", type=int, metavar="N",
                    help="no valgrind: N requests timed by os.times, one JSON line")
    ap.add_argument("--cpu", type=int, help="with --timed: pin to this CPU")
    ap.add_argument("--inner", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inner is not None:
        return inner(a)
    if a.timed is not None:
        return timed(a)
    if not shutil.which("valgrind"):
        raise SystemExit("valgrind (Debian package valgrind) is needed")
    if a.requests < 1 or a.base < 1:
        ap.error("--requests and --base must be positive")
    import tempfile
    with tempfile.TemporaryDirectory(prefix="asgi_app_cost-") as tmp:
        where = a.keep or tmp
        if a.keep:
            os.makedirs(a.keep, exist_ok=True)
        low = counted(a, a.base, where)
        high = counted(a, a.base + a.requests, where)
    per = (high - low) / a.requests
    print(f"asgi_app_cost: {a.app} called in process (no server), {a.python}: "
          f"{per:,.0f} Ir per request ({a.requests} requests: {high:,} - {low:,} Ir)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
