#!/usr/bin/env python3
"""http_callgrind: instructions per hello request (WSGI, or --app: an ASGI
app), counted by callgrind:
a before/after figure that does not depend on the machine's load (the
wall-clock hello check of blocking_app.py swings +-20 % on a shared 2-core box).

    .venv/bin/python bench/http_callgrind.py [--checkout DIR ...] [--threads 1,2]
        [--conns 4] [--requests 3000] [--warmup 300] [--runs 1] [--app hello]

For each --checkout DIR (repeatable; default this checkout; the first is the
baseline of the ratios; `DIR::ARGS` appends ARGS, shell-split, to that row's
`sockherd run`, e.g. `--checkout . --checkout '.::--access-logfile /tmp/a.log'`
for the access log's cost; DIR may also be a venv, e.g. `--checkout .venv
--checkout .venv313` for this tree on CPython 3.11 and 3.13) and each thread count, `DIR/.venv/bin/sockherd run
hello:app --interface wsgi -w 1 -t T` (bench/apps/hello.py, this checkout's
apps; --app asgi-hello: hello:asgi --interface asgi, fastapi: asgi_hello.py's
FastAPI JSON endpoint, loop-work: asgi_loop.py's loop_work:work) runs under `nice -n 19 valgrind --tool=callgrind --trace-children=yes`
with its own --runtime-dir, --control off, ready / heartbeat timeouts of
600 s (valgrind is slow) and a heartbeat every 300 s (work per second,
not per request). A Python client opens --conns keep-alive
connections and sends `GET /` round-robin, one request in flight at a time
(each answer read whole and checked: 200, "Hello, world!"): --warmup requests
uncounted, `callgrind_control -z` on the worker, --requests counted,
`callgrind_control -d`; the figure is the dump's total Ir / requests. It
counts the worker's user space (every thread: Python, the engine, libc), not
the kernel. PYTHONHASHSEED=0 everywhere. `--checkout uvicorn` (an ASGI --app)
counts the peer the same way: one uvicorn process (httptools + uvloop, as
asgi_hello.py starts it, from bench/.venv-peers) under the same valgrind. --runs N starts each server N times
(a fresh process each): the spread between runs of one checkout says how
repeatable the count is (expect well under 1 %). --keep DIR keeps the dumps
(cg-LABEL-tT-rR.PID) for `callgrind_annotate --inclusive=no DUMP`.

Prints a Markdown table: per checkout and thread count, the Ir per request of
each run, their spread, and the ratio of the mean to the first checkout's.
Every process is killed and reaped on the way out.
"""
from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys

import benchlib as B
import hol_client as HC
from echo_callgrind import total_ir

BODY = b"Hello, world!"
APPS = {
    # --app: (target, interface, the body of its answer to GET /)
    "hello": ("hello:app", "wsgi", BODY),
    "asgi-hello": ("hello:asgi", "asgi", BODY),
    "fastapi": ("fastapi_json:app", "asgi", b'{"message":"Hello, world!"}'),
    # the same with asyncio.eager_task_factory (3.12+ only)
    "fastapi-eager": ("fastapi_json:eager_app", "asgi", b'{"message":"Hello, world!"}'),
    "loop-work": ("loop_work:work", "asgi", b"loop work done"),
}


UVICORN = "uvicorn"       # --checkout uvicorn: the peer (bench/.venv-peers), not a checkout


def sockherd_bin(checkout: str) -> str:
    if checkout == UVICORN:
        if not os.access(B.PEERS_PY, os.X_OK):
            raise B.BenchError(f"{B.PEERS_PY} missing: run `sh bench/setup_peers.sh` first")
        return B.PEERS_PY
    # DIR may be a venv itself (`--checkout .venv313`: the same tree on another
    # interpreter, issue 34's 3.13-against-3.11 figures)
    path = os.path.join(checkout, "bin", "sockherd")
    if not os.access(path, os.X_OK):
        path = os.path.join(checkout, ".venv", "bin", "sockherd")
    if not os.access(path, os.X_OK):
        raise B.BenchError(f"{path} missing: make that checkout's .venv first")
    return path


def git_line(checkout: str) -> str:
    def git(*args):
        # no strip(): porcelain lines start with a status column that may be a space
        return subprocess.run(["git", "-C", checkout, *args], capture_output=True,
                              text=True).stdout.rstrip("\n")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "master", "worker",
                "fdcore", "ipc")
    return (f"git {git('rev-parse', '--short', 'HEAD')} "
            f"({git('log', '-1', '--format=%s')[:60]}), modified: "
            f"{' '.join(ln[3:] for ln in dirty.splitlines()) or 'none'}")


def peer_line() -> str:
    vers = subprocess.run([B.PEERS_PY, "-c", "import importlib.metadata as m; print(' '.join("
                           "f'{p}/{m.version(p)}' for p in ('uvicorn','uvloop','httptools',"
                           "'fastapi')))"], capture_output=True, text=True).stdout.strip()
    return (f"uvicorn APP --http httptools --loop uvloop --no-access-log, one process "
            f"({B.PEERS_VENV}: {vers})")


REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def epoll_sleepers(pid: int) -> int:
    """How many threads of pid sleep in epoll_wait (the loop threads that
    wait for work; the main thread waits in select)."""
    n = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                n += f.read().strip() == "do_epoll_wait"
        except OSError:
            pass
    return n


def requests(conns: list[HC.HttpConn], n: int, burst: bool = False,
             idle: tuple[int, int] | None = None, body: bytes = BODY) -> None:
    """n requests, one at a time round-robin over conns; burst: a request
    on every connection, then every answer read (n rounded up to that).
    idle (pid, threads): before each request, wait until that many threads
    of pid sleep in epoll_wait, so that every request meets an idle worker
    (the engine polls once without waiting, then waits: whether a request
    is there at the first poll is a race with the client that the machine's
    load decides, and it costs a poll and a GIL round trip)."""
    if not burst:
        for i in range(n):
            if idle is not None:
                B.wait_for(lambda: epoll_sleepers(idle[0]) >= idle[1], 60,
                           "the worker's loop threads asleep", interval=0.0005)
            got = conns[i % len(conns)].request("/")
            if got != body:
                raise B.BenchError(f"unexpected body {got[:60]!r}")
        return
    for _ in range(-(-n // len(conns))):
        for c in conns:
            c.sock.sendall(REQUEST)
        for c in conns:
            got = b""
            while not got.endswith(b"\r\n\r\n" + body):   # the whole answer: the body last
                d = c.sock.recv(65536)
                if not d:
                    raise B.BenchError("the server closed a connection")
                got += d
            if not got.startswith(b"HTTP/1.1 200") or got.count(b"HTTP/1.1") != 1:
                raise B.BenchError(f"unexpected answer {got[:80]!r}")


# ---- the valgrind driver (tls_callgrind.py's too) -----------------------------------------------
def callgrind_argv(pattern: str) -> list[str]:
    """What runs a server under callgrind: every process of its tree
    counted, each dump at PATTERN<pid>, at the box's lowest priority."""
    return ["nice", "-n", "19", "valgrind", "--tool=callgrind", "--trace-children=yes",
            f"--callgrind-out-file={pattern}%p"]


def sockherd_argv(checkout: str, target: str, port: int, tmp: str, tag: str) -> list[str]:
    """`sockherd run TARGET` of checkout paced for valgrind: its own
    --runtime-dir, --control off, ready / heartbeat timeouts of 600 s (valgrind
    is slow) and a heartbeat every 300 s (the worker's main thread wakes per
    heartbeat: work per second, not per request, which a slower (loaded) run
    would count more of). The caller adds -w, -t and its own flags."""
    return [sockherd_bin(checkout), "run", target, "--pythonpath", B.APPS,
            "-b", f"127.0.0.1:{port}", "--control", "off",
            "--runtime-dir", os.path.join(tmp, f"rt-{tag}"),
            "--ready-timeout", "600", "--heartbeat-timeout", "600", "--heartbeat-interval", "300"]


def start_counted(procs: B.Procs, tmp: str, pattern: str, argv: list[str], tag: str,
                  timeout: float):
    """A sockherd (argv) under callgrind, one worker: (its process, the
    worker's pid) once the worker is ready."""
    log = os.path.join(tmp, f"{tag}.log")
    p = procs.start(callgrind_argv(pattern) + argv, log_path=log,
                    env=dict(os.environ, PYTHONHASHSEED="0"), cwd=B.APPS)
    return p, B.wait_sockherd_ready(p, log, 1, timeout=timeout)[0]


def counted(pid: int, pattern: str, tag: str, timeout: float, work):
    """pid's counters zeroed, work() run, a dump asked for and awaited
    whole: (what work returned, the dump's total Ir, the dump)."""
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True,
                   timeout=timeout)
    result = work()
    before = set(glob.glob(f"{pattern}{pid}*"))
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True,
                   timeout=timeout)
    dump = B.wait_for(lambda: sorted(set(glob.glob(f"{pattern}{pid}*")) - before),
                      timeout, f"{tag} dump")[-1]
    # the dump is written by the worker: wait for its totals line
    return result, B.wait_for(lambda: _try_total(dump), timeout, f"{tag} dump complete"), dump


def stop(procs: B.Procs, p, timeout: float) -> None:
    """p (a server under callgrind) stopped: TERM, else its group killed."""
    if procs.stop(p, signal.SIGTERM, timeout=timeout) is None:
        os.killpg(p.pid, signal.SIGKILL)


def _try_total(path: str) -> int | None:
    try:
        return total_ir(path)
    except (B.BenchError, ValueError, OSError):
        return None


# ---- this bench -----------------------------------------------------------------------------
def run_one(procs: B.Procs, tmp: str, keep: str | None, checkout: str, label: str,
            threads: int, run: int, a, extra: list[str] = ()) -> float:
    port = B.free_port()
    tag = f"{label}-t{threads}-r{run}"
    pattern = os.path.join(keep or tmp, f"cg-{tag}.")
    target, interface, body = APPS[a.app]
    if checkout == UVICORN:
        # one uvicorn process (no --workers: it serves in the process it
        # starts in), asgi_hello.py's flags; the count's pid is valgrind's own
        log = os.path.join(tmp, f"{tag}.log")
        argv = [B.PEERS_PY, "-m", "uvicorn", target, "--app-dir", B.APPS,
                "--host", "127.0.0.1", "--port", str(port), "--http", "httptools",
                "--loop", "uvloop", "--no-access-log", *extra]
        p = procs.start(callgrind_argv(pattern) + argv, log_path=log,
                        env=dict(os.environ, PYTHONHASHSEED="0"), cwd=B.APPS)
        B.wait_for(lambda: "Application startup complete" in B.read_text(log), a.timeout,
                   f"{tag} started")
        return _count(procs, p, p.pid, port, pattern, tag, keep, a, body, threads)
    argv = sockherd_argv(checkout, target, port, tmp, tag) + [
        "--interface", interface, "-w", "1", "--threads", str(threads), *extra]
    p, pid = start_counted(procs, tmp, pattern, argv, tag, a.timeout)
    return _count(procs, p, pid, port, pattern, tag, keep, a, body, threads)


def _count(procs: B.Procs, p, pid: int, port: int, pattern: str, tag: str,
           keep: str | None, a, body: bytes, threads: int) -> float:
    """The server p (its serving process pid, under callgrind) answering:
    the warm-up, the counted requests, the dump; p stopped."""
    conns = [HC.HttpConn(port, a.timeout) for _ in range(a.conns)]

    def answering():            # the worker logs ready an instant before it serves
        try:
            requests(conns[:1], 1, body=body)
            return True
        except (OSError, ValueError):
            conns[0].close()
            return False
    B.wait_for(answering, a.timeout, f"{tag} answering", interval=0.2)
    try:
        for c in conns:                 # all open before the count
            if c.sock is None:
                c.request("/")
        requests(conns, a.warmup, a.burst, body=body)
        _, ir, dump = counted(pid, pattern, tag, a.timeout, lambda: requests(
            conns, a.requests, a.burst, None if a.burst or a.no_idle else (pid, threads), body))
    finally:
        for c in conns:
            c.close()
    stop(procs, p, a.timeout)
    per = ir / a.requests
    print(f"# {tag}: {per:,.0f} Ir per request ({a.requests} requests)"
          + (f", dump {dump}" if keep else ""), file=sys.stderr, flush=True)
    return per


def main() -> int:
    ap = B.arg_parser(__doc__)
    ap.add_argument("--checkout", action="append", default=[], metavar="DIR",
                    help="run sockherd from DIR/.venv (repeatable; the first is the "
                         "baseline; default: this checkout)")
    ap.add_argument("--threads", default="1,2", help="thread counts, -t of the worker (1,2)")
    ap.add_argument("--conns", type=int, default=4, help="keep-alive connections (4)")
    ap.add_argument("--requests", type=int, default=3000, help="requests counted (3000)")
    ap.add_argument("--warmup", type=int, default=300, help="requests uncounted first (300)")
    ap.add_argument("--burst", action="store_true",
                    help="a request on every connection at once, then the answers "
                         "(wrk-like batches per poll); --requests a multiple of --conns")
    ap.add_argument("--no-idle", action="store_true",
                    help="do not wait for the worker's loop threads to sleep in epoll_wait "
                         "before each request (load-dependent counts)")
    ap.add_argument("--runs", type=int, default=1, help="servers started per row (1)")
    ap.add_argument("--app", choices=list(APPS), default="hello",
                    help="the app served (hello: the WSGI hello)")
    ap.add_argument("--keep", metavar="DIR", help="keep the callgrind dumps in DIR")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds for each start, phase and stop under valgrind (600)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    threads = [int(x) for x in a.threads.split(",") if x.strip()]
    if not threads or min(threads) < 1 or a.conns < 1 or a.requests < 1 or a.runs < 1:
        ap.error("--threads, --conns, --requests and --runs must be positive")
    if a.burst and (a.requests % a.conns or a.warmup % a.conns):
        ap.error("--burst: --requests and --warmup must be multiples of --conns")
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        raise B.BenchError("valgrind (Debian package valgrind) is needed")
    specs = [c.partition("::") for c in a.checkout] or [(B.ROOT, "", "")]
    paths = [c if c == UVICORN else os.path.abspath(c) for c, _, _ in specs]
    extras = [shlex.split(x) for _, _, x in specs]
    for pth in paths:
        sockherd_bin(pth)
    labels = [os.path.basename(p) + (" " + " ".join(x) if x else "")
              for p, x in zip(paths, extras)]
    if len(set(labels)) < len(labels):
        labels = [f"{lb}#{i + 1}" for i, lb in enumerate(labels)]
    if a.keep:
        os.makedirs(a.keep, exist_ok=True)
    head = B.header(f"http_callgrind: instructions per request of {APPS[a.app][0]} "
                    f"(--interface {APPS[a.app][1]}; the worker's user space)")
    res: dict[tuple[str, int], list[float]] = {}
    with B.Procs() as procs, B.tempdir("http_callgrind-") as tmp:
        for t in threads:
            for run in range(1, a.runs + 1):
                for pth, lb, x in zip(paths, labels, extras):
                    res.setdefault((lb, t), []).append(
                        run_one(procs, tmp, a.keep, pth, re.sub(r"[^\w.-]+", "_", lb)[:60], t, run, a, x))
    print(head)
    for pth, lb in zip(paths, labels):
        print(f"- {lb}: {peer_line() if pth == UVICORN else f'{pth}, {git_line(pth)}'}")
    vg = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"- -w 1, {a.conns} keep-alive connections, "
          f"{'a request on each at once (--burst)' if a.burst else 'one request in flight'}"
          f"{'' if a.burst or a.no_idle else ', each sent once the loop threads sleep in epoll_wait'}; "
          f"{a.requests:,} requests counted after {a.warmup:,} uncounted; {vg}\n")
    rows = []
    for t in threads:
        base = sum(res[(labels[0], t)]) / len(res[(labels[0], t)])
        for lb in labels:
            vals = res[(lb, t)]
            mean = sum(vals) / len(vals)
            spread = (max(vals) - min(vals)) / mean * 100
            rows.append([f"-t {t}", lb, ", ".join(f"{v:,.0f}" for v in vals),
                         f"{spread:.2f} %" if len(vals) > 1 else "-",
                         f"{mean / base:.3f}"])
    print(B.table(["threads", "checkout", "Ir per request (each run)", "spread",
                   f"mean / {labels[0]}"], rows))
    print(B.footer())
    return 0


if __name__ == "__main__":
    sys.exit(main())
