#!/usr/bin/env python3
"""ws_callgrind: instructions per WebSocket echo, counted by callgrind, for
sockherd, uvicorn (--ws websockets) and granian: a figure the machine's
load does not move (bench/ws_echo.py's wall clock does, on a shared
2-core box).

    .venv/bin/python bench/ws_callgrind.py [--only sockherd,uvicorn,granian]
        [--messages 2000] [--kinds text,binary] [--checkout DIR ...]

--checkout DIR (repeatable) counts sockherd as DIR builds it instead
(DIR/.venv/bin/sockherd, or DIR/bin/sockherd where DIR is a venv), one row
each, the first the baseline of the ratios: a before/after of a change in
one run, e.g. `--only sockherd --checkout /tmp/base --checkout .`.

Each server serves tests/apps/asgi_ws_echo.py with ONE worker under
`valgrind --tool=callgrind --trace-children=yes` at nice 19:

  sockherd  sockherd run asgi_ws_echo:app --interface asgi -w 1 --threads 1 --control off
  uvicorn   uvicorn asgi_ws_echo:app --ws websockets --http httptools --loop uvloop
            (no --workers: one process, which serves)
  granian   granian --interface asgi --workers 1 asgi_ws_echo:app

One WebSocket (tests/ws_conformance/rfc6455_client.py's client) sends a
masked 1 KiB message, reads the echo (checked) and sends the next. Per
kind: 200 uncounted, `callgrind_control -z` on the serving process,
--messages counted, `callgrind_control -d`; the figure is the dump's total
Ir / messages: the serving process's user space, every thread (Python, the
engine or the Rust runtime, libc), not the kernel's side of the reads and
writes. PYTHONHASHSEED=0 everywhere. --keep DIR keeps the dumps, named
SERVER-KIND.callgrind, for callgrind_annotate.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import time

import benchlib as B
import echo_callgrind as E
import ws_echo as W
from http_callgrind import git_line, sockherd_bin

sys.path.insert(0, os.path.join(B.ROOT, "tests", "ws_conformance"))
from rfc6455_client import BINARY, PING, PONG, TEXT, Client, frame  # noqa: E402

SERVERS = ("sockherd", "uvicorn", "granian")


def argv_of(server: str, port: int, tmp: str, checkout: str | None = None) -> list[str]:
    app = "asgi_ws_echo:app"
    if server == "sockherd":
        return [sockherd_bin(checkout) if checkout else B.SOCKHERD, "run", app, "--interface", "asgi", "-w", "1", "--threads", "1",
                "-b", f"127.0.0.1:{port}", "--pythonpath", W.TESTS_APPS, "--control", "off",
                "--ready-timeout", "600", "--heartbeat-timeout", "600",
                "--runtime-dir", os.path.join(tmp, "run")]
    if server == "uvicorn":
        return [os.path.join(B.PEERS_VENV, "bin", "uvicorn"), app, "--app-dir", W.TESTS_APPS,
                "--host", "127.0.0.1", "--port", str(port), "--ws", "websockets",
                "--http", "httptools", "--loop", "uvloop", "--no-access-log"]
    return [os.path.join(B.PEERS_VENV, "bin", "granian"), "--interface", "asgi", "--workers",
            "1", "--host", "127.0.0.1", "--port", str(port), "--working-dir", W.TESTS_APPS, app]


def echo(c: Client, opcode: int, payload: bytes, n: int) -> None:
    """n echoes; a server's keep-alive ping answered (uvicorn pings every
    20 s and closes 1011 without a pong: under valgrind a run lasts longer)."""
    data = frame(opcode, payload)
    for _ in range(n):
        c.send(data)
        o = c.outcome(messages=1)
        if o.messages != [(opcode, payload)]:
            raise B.BenchError(f"echo mismatch: {o!r}")
        for op, ping in o.frames:
            if op == PING:
                c.send(frame(PONG, ping))


def run_one(procs: B.Procs, tmp: str, server: str, a, checkout: str | None = None,
            label: str | None = None) -> dict:
    """One server's counts; checkout: sockherd as that tree builds it, under
    label (its row's name, also its files' names)."""
    label = label or server
    port = B.free_port()
    log = os.path.join(tmp, f"{label}.log")
    cgout = os.path.join(tmp, f"cg-{label}.%p")
    vg = ["nice", "-n", "19", "valgrind", "--tool=callgrind", "--trace-children=yes",
          f"--callgrind-out-file={cgout}"]
    env = dict(os.environ, PYTHONHASHSEED="0")
    p = procs.start(vg + argv_of(server, port, tmp, checkout), log_path=log, env=env, cwd=tmp)
    ready = {"sockherd": r"worker \d+\.\d+: ready, pid (\d+)",
             "uvicorn": r"Started server process \[(\d+)\]",
             "granian": r"Started worker-1 \(pid: ?(\d+)\)|Started worker-1"}[server]

    def started():
        if p.poll() is not None:
            raise B.BenchError(f"{server} exited {p.returncode}: {B.read_text(log)[-2000:]}")
        return re.search(ready, B.read_text(log)) and B.can_connect(port)
    B.wait_for(started, a.timeout, f"{server} ready")
    # the serving process: the worker the log names, else the deepest of the tree
    m = re.search(ready, B.read_text(log))
    pid = int(m.group(1)) if m.lastindex and m.group(1) else B.tree(p.pid)[-1]
    res = {"server": label, "pid": pid}
    c = Client(("127.0.0.1", port), timeout=a.timeout)
    if c.status != 101:
        raise B.BenchError(f"{server}: upgrade answered {c.status}")
    for kind in a.kinds:
        opcode = TEXT if kind == "text" else BINARY
        payload = (bytes(range(97, 123)) * 40)[:1024] if kind == "text" else \
            bytes(i * 7 & 0xFF for i in range(1024))
        echo(c, opcode, payload, 200)
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True,
                       capture_output=True, timeout=a.timeout)
        t0 = time.monotonic()
        echo(c, opcode, payload, a.messages)
        before = set(glob.glob(os.path.join(tmp, f"cg-{label}.{pid}*")))
        subprocess.run(["callgrind_control", "-d", str(pid)], check=True,
                       capture_output=True, timeout=a.timeout)
        dump = B.wait_for(lambda: sorted(set(glob.glob(os.path.join(
            tmp, f"cg-{label}.{pid}*"))) - before), a.timeout, f"{server} dump")[-1]
        res[kind] = E.total_ir(dump) / a.messages
        if a.keep:
            os.makedirs(a.keep, exist_ok=True)
            shutil.copy(dump, os.path.join(a.keep, f"{label}-{kind}.callgrind"))
        print(f"# {label} {kind}: {res[kind]:,.0f} Ir per echo ({a.messages} in "
              f"{time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
    c.close()
    procs.stop(p, timeout=a.timeout)
    return res


def main() -> int:
    ap = B.arg_parser(__doc__)
    ap.add_argument("--only", default=",".join(SERVERS))
    ap.add_argument("--kinds", default="text,binary")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--keep", metavar="DIR", help="copy each dump into DIR (callgrind_annotate)")
    ap.add_argument("--checkout", action="append", default=[], metavar="DIR",
                    help="sockherd as DIR builds it (repeatable; the first is the baseline)")
    a = ap.parse_args()
    a.kinds = [k for k in a.kinds.split(",") if k]
    only = [s for s in a.only.split(",") if s]
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        print("valgrind (Debian package valgrind) is needed", file=sys.stderr)
        return 2
    B.check_sockherd()
    if set(only) - {"sockherd"}:
        B.check_peers_venv()
    head = B.header("ws_callgrind: instructions per WebSocket echo (user space, one worker)")
    results = []
    with B.Procs() as procs, B.tempdir("ws_callgrind-") as tmp:
        for s in only:
            if s == "sockherd" and a.checkout:
                for i, c in enumerate(a.checkout):
                    results.append(run_one(procs, tmp, s, a, os.path.abspath(c), f"sockherd{i}"))
            else:
                results.append(run_one(procs, tmp, s, a))
    print(head)
    print(f"- one WebSocket, 1 KiB messages one at a time; {a.messages:,} counted after 200")
    print()
    for i, c in enumerate(a.checkout):
        print(f"- sockherd{i}: {c} ({git_line(c)})")
    ref = {r["server"]: r for r in results}
    base = "sockherd0" if a.checkout else "sockherd"
    rows = []
    for r in results:
        row = [r["server"]]
        for kind in a.kinds:
            row.append(f"{r[kind]:,.0f}")
            row.append(f"{ref[base][kind] / r[kind]:.3f}" if base in ref else "-")
        rows.append(row)
    cols = ["server"]
    for kind in a.kinds:
        cols += [f"{kind}: Ir per echo", f"{kind}: {base} / this"]
    print(B.table(cols, rows))
    print(B.footer())
    return 0


if __name__ == "__main__":
    sys.exit(main())
