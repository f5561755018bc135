#!/usr/bin/env python3
"""bad_reload: a reload to an app that is READY but crashes 1 s after its
first request, under load (issue 19 §7), and what the clients saw.

    PY bench/bad_reload.py [--python PY] [--seconds 25] [--clients 4] [--workers 2]
        [--probation 10]

--python: the interpreter whose sockherd runs the master (a venv of another
checkout: the tree before a fix). --probation is passed as
--reload-probation only when that sockherd's `run --help` knows it.

The master serves v1 (`-w WORKERS --threads 2`, WSGI) on loopback with its runtime
directory in a temporary one; CLIENTS threads request in a closed loop (half
a new connection per request, half keep-alive); 2 s in, the app is replaced
by v2 and `sockherd ctl reload` runs; the load goes on for --seconds in all.
Counted per request: ok (200) by version, refused (ECONNREFUSED: nobody
listens any more), other failures (reset, EOF, timeout: a connection a
crashing worker held). Printed: those counts, ctl reload's exit status and
answer, whether the master was still alive at the end.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

APP = """
import os, threading
VERSION = {version!r}
_armed = []
def app(environ, start_response):
    if {crash} and not _armed:
        _armed.append(1)
        threading.Timer(1.0, os._exit, (3,)).start()   # 1 s after its first request
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [VERSION.encode()]
"""


class Load:
    def __init__(self, port: int, clients: int):
        self.port, self.stop = port, threading.Event()
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i % 2 == 1,), daemon=True)
                        for i in range(clients)]
        for t in self.threads:
            t.start()

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def run(self, keep: bool) -> None:
        conn = None
        while not self.stop.is_set():
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            try:
                conn.request("GET", "/")
                r = conn.getresponse()
                body = r.read().decode()
                self.count(f"ok {body}" if r.status == 200 else f"status {r.status}")
                if not keep or r.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except ConnectionRefusedError:
                self.count("refused")
                conn.close()
                conn = None
                time.sleep(0.01)           # refused at once: do not spin
            except Exception as exc:  # noqa: BLE001 - counted, that is the measurement
                self.count(f"failed {type(exc).__name__}")
                conn.close()
                conn = None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--seconds", type=float, default=25.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--probation", type=float, default=10.0)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bad_reload."))
    (tmp / "badapp_v.py").write_text(APP.format(version="v1", crash=False))
    helptext = subprocess.run([a.python, "-m", "sockherd.master", "run", "--help"],
                              capture_output=True, text=True).stdout
    extra = ["--reload-probation", str(a.probation)] if "--reload-probation" in helptext else []
    log = open(tmp / "master.log", "wb")
    env = {**os.environ, "SOCKHERD_RUNTIME_DIR": str(tmp / "run")}
    env.pop("SOCKHERD_RELOAD_PROBATION", None)
    master = subprocess.Popen([a.python, "-m", "sockherd.master", "run", "badapp_v:app",
                               "-w", str(a.workers), "--threads", "2", "-b", "127.0.0.1:0",
                               "--chdir", str(tmp), *extra], stdout=log,
                              stderr=subprocess.STDOUT, cwd=tmp, env=env)
    try:
        port = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
                port and (tmp / "master.log").read_text().count(": ready") >= a.workers):
            text = (tmp / "master.log").read_text()
            if "listening on 127.0.0.1:" in text:
                port = int(text.split("listening on 127.0.0.1:")[1].split()[0])
            time.sleep(0.05)
        load = Load(port, a.clients)
        started = time.monotonic()
        time.sleep(2.0)
        (tmp / "badapp_v.py").write_text(APP.format(version="v2", crash=True))
        ctl = subprocess.run([a.python, "-m", "sockherd.master", "ctl", "--runtime-dir",
                              str(tmp / "run"), "reload"], capture_output=True, text=True,
                             env=env, timeout=120)
        left = a.seconds - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)
        load.stop.set()
        for t in load.threads:
            t.join(10)
        alive = master.poll() is None
        counts = dict(sorted(load.counts.items()))
        ok = sum(n for k, n in counts.items() if k.startswith("ok"))
        refused = counts.get("refused", 0)
        print(json.dumps({
            "python": a.python, "probation": extra[1] if extra else None,
            "seconds": a.seconds, "clients": a.clients, "workers": a.workers,
            "ok": ok, "refused": refused,
            "failed_other": sum(load.counts.values()) - ok - refused,
            "counts": counts, "ctl_reload_exit": ctl.returncode,
            "ctl_reload_answer": (ctl.stdout + ctl.stderr).strip(),
            "master_alive_at_end": alive, "log": str(tmp / "master.log"),
        }, indent=2))
        return 0
    finally:
        if master.poll() is None:
            master.send_signal(signal.SIGQUIT)
            try:
                master.wait(20)
            except subprocess.TimeoutExpired:
                master.kill()
                master.wait()
        log.close()


if __name__ == "__main__":
    sys.exit(main())
