#!/usr/bin/env python3
"""bad_upgrade: requests ok and refused while a master is upgraded to an
image that exits during its start-up (issue 19, finding 8).

    .venv/bin/python bench/bad_upgrade.py [--window 8] [--clients 4] [--json out.json]

The sockherd under test is the one of the interpreter running this script
(run it with another tree's venv for a before/after). It starts
`sockherd run reload_app:app -w 2` (bench/apps) on a free loopback port in a
temporary runtime directory, keeps --clients closed-loop clients sending one
GET per new connection, waits for 2 s of traffic, then sets `python` to a
wrapper of the same interpreter whose sockherd exits (sys.exit(1)) when the
master attaches its control server: after the exec (the pre-exec check,
which runs `python -m sockherd.master.upgrade`, is left alone). USR2, then
--window s of load counted: ok, refused (ECONNREFUSED), other failures;
then whether the master's pid is still there, and what it logged of it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

SITECUSTOMIZE = '''
import importlib.abc, importlib.machinery, sys


class _Exiting(importlib.abc.Loader):
    def __init__(self, real):
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        self.real.exec_module(module)
        def attach(*args, **kwargs):
            sys.exit(1)
        module.attach = attach


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "sockherd.master.control":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = _Exiting(spec.loader)
        return spec


sys.meta_path.insert(0, _Finder())
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Load:
    def __init__(self, port: int, n: int):
        self.port, self.ok, self.refused, self.other = port, 0, 0, 0
        self.counting = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(n)]
        for t in self._threads:
            t.start()

    def _one(self) -> str:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            return "ok" if data.startswith(b"HTTP/1.1 200") else "other"
        except ConnectionRefusedError:
            return "refused"
        except OSError:
            return "other"

    def _run(self) -> None:
        while not self._stop.is_set():
            what = self._one()
            if self.counting:
                with self._lock:
                    setattr(self, what, getattr(self, what) + 1)
            if what == "refused":
                time.sleep(0.01)              # a dead port: do not spin the machine

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=8.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bad_upgrade-"))
    site = tmp / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    wrapper = tmp / "newpython"
    wrapper.write_text("#!/bin/sh\n"
                       f'if [ "$2" = sockherd.master.upgrade ]; then exec {sys.executable} "$@"; fi\n'
                       f"export PYTHONPATH={site}\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    config = tmp / "sockherd.toml"
    config.write_text("")
    port = free_port()
    log = tmp / "master.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sockherd.master", "run", "reload_app:app",
                                 "-w", "2", "-b", f"127.0.0.1:{port}", "-c", str(config),
                                 "--chdir", str(HERE / "apps"), "--runtime-dir", str(tmp / "run")],
                                stdout=out, stderr=subprocess.STDOUT)
    load = None
    try:
        deadline = time.monotonic() + 60
        while len(re.findall(r"worker \d+\.\d+: ready", log.read_text())) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        load = Load(port, args.clients)
        time.sleep(2.0)                                    # traffic before the upgrade
        config.write_text(f'python = "{wrapper}"\n')
        load.counting = True
        proc.send_signal(signal.SIGUSR2)
        time.sleep(args.window)
        load.counting = False
        alive = proc.poll() is None
        text = log.read_text()
    finally:
        if load is not None:
            load.stop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(30)
    row = {"window_s": args.window, "clients": args.clients, "ok": load.ok,
           "refused": load.refused, "other_failures": load.other, "master_alive": alive,
           "came_back": "upgrade: came back" in text,
           "master_gone_in_worker_log": "the master is gone" in text}
    print(f"{args.window:g}s after USR2 to an image that exits at start-up: {load.ok} ok, "
          f"{load.refused} refused, {load.other} other failures; master pid "
          f"{'alive' if alive else 'gone'}; came back: {row['came_back']}")
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
