"""The master under an fd squeeze (issue 19, finding 3): before/after figures.

Two runs of a real master (`-w 2`, a WSGI hello app, --metrics), each on a
tree given by its interpreter (--python: the branch's .venv/bin/python, or
an older checkout's for "before"):

squeeze  started with RLIMIT_NOFILE soft = hard = --nofile (80); clients of
         the metrics listener keep as many connections open as it takes
         (dripping a header line now and then, reopened when cut) for
         --squeeze seconds; 2 s in, a worker is SIGKILLed: time until its
         successor is READY; then `sockherd ctl status` (answered or not, in
         how long); whether the master is alive, else its exit status (134 /
         SIGABRT: libzmq's assert on EMFILE); /-/ready after the squeeze.
emfile   the master's soft limit lowered from outside to 5 (no fd number
         free: a spawn meets EMFILE in the master itself), a worker killed,
         the limit given back after 9 s (past the old give-up: 0.5+1+2+4 s
         of back-off): whether the slot was given up, and the time from the
         limit's return to the successor's READY.

Run from the repository root:

    .venv/bin/python bench/fd_squeeze.py                              # this tree
    .venv/bin/python bench/fd_squeeze.py --python /path/to/before/.venv/bin/python
"""
from __future__ import annotations

import argparse
import http.client
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time

import benchlib as B

APP = "def app(environ, start_response):\n" \
      "    start_response('200 OK', [('Content-Type', 'text/plain')])\n" \
      "    return [b'hello']\n"


def start(procs: B.Procs, py: str, tmp: str, nofile: int | None, mport: int):
    with open(os.path.join(tmp, "fdapp.py"), "w") as f:
        f.write(APP)
    log = os.path.join(tmp, f"master-{nofile}.log")
    argv = [py, "-m", "sockherd.master", "run", "fdapp:app", "-w", "2", "-b", "127.0.0.1:0",
            "--metrics", f"127.0.0.1:{mport}", "--chdir", tmp,
            "--runtime-dir", os.path.join(tmp, f"run-{nofile}")]
    if nofile:                      # soft = hard: raising the soft limit gives nothing
        argv = ["prlimit", f"--nofile={nofile}:{nofile}", "--", *argv]
    p = procs.start(argv, log_path=log, cwd=tmp)
    B.wait_sockherd_ready(p, log, 2)
    return p, log


def ready_count(log: str) -> int:
    return len(re.findall(r"worker \d+\.\d+: ready, pid", B.read_text(log)))


def ctl_status(py: str, tmp: str, nofile) -> tuple[str, float]:
    t0 = time.monotonic()
    try:
        done = subprocess.run([py, "-m", "sockherd.master", "ctl", "--runtime-dir",
                               os.path.join(tmp, f"run-{nofile}"), "status"],
                              capture_output=True, timeout=15)
        got = "answered" if done.returncode == 0 else f"failed ({done.returncode})"
    except subprocess.TimeoutExpired:
        got = "no answer in 15 s"
    return got, time.monotonic() - t0


def http_ready(port: int) -> str:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/-/ready")
        return str(c.getresponse().status)
    except OSError as exc:
        return type(exc).__name__
    finally:
        c.close()


class Drippers:
    """n connections to the metrics listener, each a request that never ends."""

    def __init__(self, port: int, n: int):
        self.port, self.n, self.socks, self.rounds = port, n, {}, 0

    def keep_up(self) -> None:
        self.rounds += 1
        for s, started in list(self.socks.items()):
            try:
                cut = s.recv(4096, socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                cut = False
            except OSError:
                cut = True
            if cut:
                s.close()
                del self.socks[s]
                continue
            try:
                if not started:
                    s.send(b"GET /metrics HTTP/1.1\r\n")
                    self.socks[s] = True
                elif self.rounds % 10 == 0:
                    s.send(b"X-Drip: 1\r\n")
            except OSError:
                pass
        while len(self.socks) < self.n:
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", self.port))
            self.socks[s] = False

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.socks = {}


def squeeze(py: str, tmp: str, nofile: int, seconds: float) -> list:
    mport = B.free_port()
    with B.Procs() as procs:
        p, log = start(procs, py, tmp, nofile, mport)
        drip = Drippers(mport, 2 * nofile)
        took, ctl, ctl_s = None, "not asked (master gone)", 0.0
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 2.0:
                drip.keep_up()
                time.sleep(0.05)
            fds = len(os.listdir(f"/proc/{p.pid}/fd")) if p.poll() is None else "-"
            before = ready_count(log)
            victim = B.children_map().get(p.pid, [None])[0]
            killed = time.monotonic()
            if victim:
                os.kill(victim, signal.SIGKILL)
            while time.monotonic() - t0 < seconds and p.poll() is None:
                drip.keep_up()
                if took is None and ready_count(log) > before:
                    took = time.monotonic() - killed
                    if p.poll() is None:
                        ctl, ctl_s = ctl_status(py, tmp, nofile)
                time.sleep(0.05)
            if took is None and p.poll() is None:
                ctl, ctl_s = ctl_status(py, tmp, nofile)
        finally:
            drip.close()
        time.sleep(0.5)
        alive = "alive" if p.poll() is None else f"exited {p.returncode}"
        ready = http_ready(mport) if p.poll() is None else "-"
        gave_up = "yes" if "gave up" in B.read_text(log) else "no"
        return ["squeeze", nofile, fds, f"{took:.2f}" if took is not None else "never",
                gave_up, f"{ctl} ({ctl_s:.2f} s)", alive, ready]


def emfile(py: str, tmp: str) -> list:
    mport = B.free_port()
    with B.Procs() as procs:
        p, log = start(procs, py, tmp, None, mport)
        _, hard = resource.prlimit(p.pid, resource.RLIMIT_NOFILE)
        victim = B.children_map().get(p.pid, [None])[0]
        before = ready_count(log)
        resource.prlimit(p.pid, resource.RLIMIT_NOFILE, (5, hard))
        try:
            os.kill(victim, signal.SIGKILL)
            end = time.monotonic() + 9
            while time.monotonic() < end and p.poll() is None:
                time.sleep(0.1)
        finally:
            if p.poll() is None:
                resource.prlimit(p.pid, resource.RLIMIT_NOFILE, (hard, hard))
        back = time.monotonic()
        took = None
        while time.monotonic() - back < 15 and p.poll() is None:
            if ready_count(log) > before:
                took = time.monotonic() - back
                break
            time.sleep(0.05)
        gave_up = "yes" if "gave up" in B.read_text(log) else "no"
        alive = "alive" if p.poll() is None else f"exited {p.returncode}"
        return ["emfile", "5 (soft)", "-", f"{took:.2f} after the limit came back"
                if took is not None else "never", gave_up, "-", alive, "-"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter whose sockherd is measured")
    ap.add_argument("--nofile", type=int, default=80)
    ap.add_argument("--squeeze", type=float, default=12.0)
    args = ap.parse_args()
    rows = []
    with B.tempdir("fdsqueeze-") as tmp:
        rows.append(squeeze(args.python, tmp, args.nofile, args.squeeze))
        rows.append(emfile(args.python, tmp))
    print(B.header(f"master under an fd squeeze ({args.python})"))
    print(B.table(["run", "RLIMIT_NOFILE", "master fds 2 s in", "respawn (s)", "slot given up",
                   "ctl status", "master after", "/-/ready after"], rows))
    print(B.footer())
    return 0


if __name__ == "__main__":
    sys.exit(main())
