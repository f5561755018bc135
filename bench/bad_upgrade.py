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
which runs `python -m sockherd.master.upgrade`, is left alone). Counted from
the USR2 to --window s after the exec (logged `upgrade: re-executing`): ok,
refused (ECONNREFUSED; a refused client waits 10 ms before its next try),
other failures; then whether the master's pid is still there, and whether
it came back (logged `upgrade: came back`).
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

# control.attach exits once the control module is imported: every import
# statement checks (the cli imports control, then calls attach at once)
SITECUSTOMIZE = '''
import builtins, sys

_import = builtins.__import__


def _exit(*args, **kwargs):
    sys.exit(1)


def _checking(*args, **kwargs):
    module = _import(*args, **kwargs)
    control = sys.modules.get("sockherd.master.control")
    # once it is whole (its own imports run while it is half made)
    if control is not None and not getattr(control.__spec__, "_initializing", False) \
            and control.__dict__.get("attach") not in (None, _exit):
        control.attach = _exit
    return module


builtins.__import__ = _checking
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
        # the window runs from the exec (the pre-exec check before it takes
        # seconds on a loaded machine)
        deadline = time.monotonic() + 60
        while "upgrade: re-executing" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
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
    print(f"USR2 to {args.window:g}s after the exec of an image that exits at start-up: "
          f"{load.ok} ok, "
          f"{load.refused} refused, {load.other} other failures; master pid "
          f"{'alive' if alive else 'gone'}; came back: {row['came_back']}")
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
