"""The pieces of bench/master_abuse.py (issue 19): a real master to abuse,
what is measured on it while it is abused, and the clients that abuse it.

Version-agnostic on purpose: the same driver measures a checkout from before
issue 19 and one after its fixes, so it talks to the master only through
what both have (flags, log lines, the wire formats of ipc/frames.py and of
the control protocol, written out here rather than imported) and reports
"n/a" when a checkout lacks a feature an abuse needs.

Every process goes through benchlib.Procs (its own session, the group killed
at the end whatever happens); every wait is a poll with a deadline.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time

from benchlib import Procs, free_port, tree, wait_for

# ipc/frames.py's header: magic "SH" | version | kind | nfds u32 | length u32
FRAME = struct.Struct("!2sBBII")
KIND_MSG = 1
FD_BATCH = 252
READY_LINE = r"worker \d+\.\d+: ready"

# One WSGI app for every abuse; what it does depends on the path, and on
# version.txt read at import (a reload's new generation reads it again).
APP = r'''
import gc, os, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
VERSION = open(os.path.join(HERE, "version.txt")).read().strip()
_armed = []
if VERSION == "crash":
    open(os.path.join(HERE, "crash-imported-%d" % os.getpid()), "w").close()


def _generation_up():
    # both workers of the crashing generation imported (-w 2): its first
    # worker does not crash while its sibling is still starting (the reload
    # would be refused, not committed, on a loaded machine)
    return sum(n.startswith("crash-imported-") for n in os.listdir(HERE)) >= 2


def _channel_fd():
    # the worker's channel to its master: app code can find it (issue 19 §1)
    from sockherd.ipc.channel import Channel
    return next(o for o in gc.get_objects() if isinstance(o, Channel)).fileno()


def _frame(msg):
    from sockherd.ipc import messages
    from sockherd.ipc.frames import encode_frames
    (frame, _), = encode_frames(messages.encode(msg), [])
    return frame


def app(environ, start_response):
    path = environ["PATH_INFO"]
    if VERSION == "crash" and not _armed and _generation_up():
        # a generation that crashes about 1 s after its first request (§7)
        _armed.append(threading.Timer(1.0, os._exit, (3,)))
        _armed[0].start()
    if path == "/dup-ready":
        from sockherd.ipc import messages
        os.write(_channel_fd(), _frame(messages.Ready(pid=os.getpid())))
    elif path == "/half-frame":
        # half a heartbeat frame now, the rest 4.5 s later (§6)
        from sockherd.ipc import messages
        frame = _frame(messages.Heartbeat(seq=7, sent_at=time.monotonic()))
        fd, half = _channel_fd(), len(frame) // 2
        os.write(fd, frame[:half])
        threading.Timer(4.5, os.write, (fd, frame[half:])).start()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"%s %d" % (VERSION.encode(), os.getpid())]
'''

# An image for the upgrade abuse (§8): the interpreter passes the pre-exec
# check (anything but `... run ...`), and the master it runs fails in its
# start-up (its Supervisor cannot be built). The fault is for that process
# alone: sitecustomize takes itself out of the environment first, so a
# previous image re-executed from it (the fix) starts clean.
BROKEN_PY = """#!/bin/sh
case " $* " in
  *" run "*) export SOCKHERD_BENCH_BROKEN=1 PYTHONPATH="{fault}${{PYTHONPATH:+:$PYTHONPATH}}";;
esac
exec {python} "$@"
"""
SITECUSTOMIZE = r'''
import os, sys
if os.environ.pop("SOCKHERD_BENCH_BROKEN", ""):
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    if rest:
        os.environ["PYTHONPATH"] = os.pathsep.join(rest)
    else:
        os.environ.pop("PYTHONPATH", None)
    import importlib.abc, importlib.machinery

    def _broken(*args, **kwargs):
        raise RuntimeError("bench: this image fails at start-up")

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "sockherd.master.supervisor":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                if hasattr(module, "Supervisor"):
                    module.Supervisor.__init__ = _broken
                else:
                    _broken()
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Hook())
'''


def alive(pid: int) -> bool:
    """Running: exists and is no zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0


def counts(pid: int) -> dict | None:
    """The master's threads, open fds and RSS (MB); None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    field = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if field.get("State", "").strip().startswith("Z") or "VmRSS" not in field:
        return None                        # exiting
    return {"threads": int(field["Threads"]), "fds": fds,
            "rss": int(field["VmRSS"].split()[0]) / 1024}


class Background:
    """A measuring loop (_run, until _stop is set) in a daemon thread for the
    duration of a with block."""

    def __init__(self, threads: int = 1):
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join()

    def _run(self):
        raise NotImplementedError


class Sampler(Background):
    """Samples a master's counts every 50 ms in a thread: base, peak, last."""

    def __init__(self, pid: int):
        super().__init__()
        self.pid = pid
        self.base = counts(pid) or {"threads": 0, "fds": 0, "rss": 0.0}
        self.peak = dict(self.base)
        self.last = dict(self.base)

    def _run(self):
        while not self._stop.wait(0.05):
            c = counts(self.pid)
            if c is None:
                continue
            self.last = c
            for k, v in c.items():
                self.peak[k] = max(self.peak[k], v)

    def row(self) -> dict:
        b, p = self.base, self.peak
        return {"threads": f"{b['threads']} -> {p['threads']}", "fds": f"{b['fds']} -> {p['fds']}",
                "rss": f"{b['rss']:.0f} -> {p['rss']:.0f}"}


def ready_probe(port: int, timeout: float = 3.0) -> tuple[str, float]:
    """GET /-/ready on a fresh connection: (status or error, seconds)."""
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", "/-/ready")
        r = c.getresponse()
        r.read()
        return str(r.status), time.monotonic() - t0
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__, time.monotonic() - t0
    finally:
        c.close()


class ReadyProber(Background):
    """/-/ready every 200 ms in a thread: the worst latency, the failures."""

    def __init__(self, port: int, every: float = 0.2, timeout: float = 3.0):
        super().__init__()
        self.port, self.every, self.timeout = port, every, timeout
        self.results: list[tuple[str, float]] = []

    def _run(self):
        while not self._stop.is_set():
            self.results.append(ready_probe(self.port, self.timeout))
            self._stop.wait(self.every)

    def summary(self) -> str:
        if not self.results:
            return "n/a"
        worst = max(t for _, t in self.results)
        bad = [s for s, _ in self.results if s != "200"]
        text = f"max {worst * 1000:.0f} ms"
        if bad:
            kinds = sorted(set(bad))
            text += f", {len(bad)}/{len(self.results)} not 200 ({', '.join(kinds)})"
        return text


def ctl(endpoint: str, command: str, timeout: float = 3.0) -> tuple[str, float, dict | None]:
    """One control request through a fresh REQ socket: (outcome, seconds,
    the reply). Outcome: "ok", "error", "timeout"."""
    import zmq

    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    t0 = time.monotonic()
    try:
        s.connect(endpoint)
        s.send(json.dumps({"command": command}).encode())
        if not s.poll(int(timeout * 1000), zmq.POLLIN):
            return "timeout", time.monotonic() - t0, None
        reply = json.loads(s.recv())
        return ("ok" if reply.get("ok") else "error"), time.monotonic() - t0, reply
    finally:
        s.close()


class Load(Background):
    """HTTP GETs on fresh connections from `threads` threads: ok, refused
    (ConnectionRefusedError), failed (anything else), and the answers' text
    (version and pid) with the time they came."""

    def __init__(self, port: int, threads: int = 2, path: str = "/"):
        super().__init__(threads)
        self.port, self.path = port, path
        self.ok = self.refused = self.failed = 0
        self.answers: list[tuple[float, str]] = []
        self.errors: dict[str, int] = {}
        self._lock = threading.Lock()

    def _run(self):
        while not self._stop.is_set():
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3)
            try:
                c.request("GET", self.path)
                r = c.getresponse()
                body = r.read().decode(errors="replace")
                with self._lock:
                    if r.status == 200:
                        self.ok += 1
                        self.answers.append((time.monotonic(), body))
                    else:
                        self.failed += 1
                        self.errors[str(r.status)] = self.errors.get(str(r.status), 0) + 1
            except ConnectionRefusedError:
                with self._lock:
                    self.refused += 1
                self._stop.wait(0.01)         # a closed port answers at once: no spin
            except (OSError, http.client.HTTPException) as exc:
                with self._lock:
                    self.failed += 1
                    self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1
            finally:
                c.close()

    def counts(self) -> str:
        return f"{self.ok} ok / {self.failed} failed / {self.refused} refused"


def get(port: int, path: str = "/", timeout: float = 5.0) -> str:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        return c.getresponse().read().decode(errors="replace")
    finally:
        c.close()


class Master:
    """A real `sockherd run` master of the checkout under test, in its own
    session, with its own runtime dir, metrics address and hand-off socket."""

    def __init__(self, procs: Procs, python: str, workdir: str, name: str = "m",
                 workers: int = 2, extra=(), metrics: bool = True, handoff: bool = True,
                 bind: str = "127.0.0.1:0", runtime: str | None = None, config: str | None = None):
        self.workdir = workdir
        self.runtime = runtime or os.path.join(workdir, "run")
        self.endpoint = f"ipc://{os.path.join(self.runtime, 'control')}"
        self.handoff = os.path.join(self.runtime, "handoff.sock") if handoff else ""
        self.mport = free_port() if metrics else 0
        self.log = os.path.join(workdir, f"{name}.log")
        argv = [python, "-m", "sockherd.master", "run", "app:app", "--chdir", workdir,
                "-w", str(workers), "-b", bind, "--runtime-dir", self.runtime]
        if config:
            argv += ["-c", config]
        if metrics:
            argv += ["--metrics", f"127.0.0.1:{self.mport}"]
        if self.handoff:
            argv += ["--handoff-socket", self.handoff]
        argv += list(extra)
        os.makedirs(self.runtime, mode=0o700, exist_ok=True)
        self.proc = procs.start(argv, log_path=self.log, cwd=workdir)
        self.pid = self.proc.pid
        self.port = 0

    def text(self) -> str:
        try:
            with open(self.log, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.text()))

    def wait_log(self, pattern: str, timeout: float = 30, count: int = 1):
        def found():
            if self.proc.poll() is not None:
                raise RuntimeError(f"master exited {self.proc.returncode}:\n{self.text()[-3000:]}")
            m = re.findall(pattern, self.text())
            return m if len(m) >= count else None
        return wait_for(found, timeout, f"log line {pattern!r} x{count} in {self.log}")

    def started(self, workers: int = 2, timeout: float = 60) -> "Master":
        self.port = int(self.wait_log(r"listening on 127\.0\.0\.1:(\d+)", timeout)[0])
        self.wait_log(READY_LINE, timeout, count=workers)
        if self.mport:
            wait_for(lambda: ready_probe(self.mport, 1)[0] == "200", timeout, "/-/ready 200")
        return self

    def alive(self) -> bool:
        return self.proc.poll() is None and alive(self.pid)

    def exit_text(self, died: str = "DIED") -> str:
        if self.alive():
            return "alive"
        rc = self.proc.poll()
        return f"{died} (exit {rc})" if rc is not None else died

    def workers(self) -> list[int]:
        return children(self.pid)

    def tree(self) -> list[int]:
        return tree(self.pid)


def write_app(workdir: str, version: str = "v1") -> None:
    with open(os.path.join(workdir, "app.py"), "w") as f:
        f.write(APP)
    with open(os.path.join(workdir, "version.txt"), "w") as f:
        f.write(version)


def write_broken_python(workdir: str, python: str) -> str:
    fault = os.path.join(workdir, "broken-image")
    os.makedirs(fault, exist_ok=True)
    with open(os.path.join(fault, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    path = os.path.join(workdir, "broken-python")
    with open(path, "w") as f:
        f.write(BROKEN_PY.format(fault=fault, python=python))
    os.chmod(path, 0o755)
    return path


def frame_header(nfds: int, length: int) -> bytes:
    return FRAME.pack(b"SH", 1, KIND_MSG, nfds, length)


def handoff_session(path: str, *, nfds: int = 0, length: int = 64, send: int = 0,
                    timeout: float = 2.0) -> tuple[socket.socket | None, str]:
    """A hand-off client that starts a frame announcing `length` payload
    bytes and sends `send` of them (never the whole frame), its first bytes
    carrying `nfds` fds (copies of /dev/null): (the socket, kept open by the
    caller; what happened)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            s.connect(path)
            break
        except BlockingIOError:             # its backlog is full: the master accepts soon
            if time.monotonic() > deadline:
                s.close()
                return None, "connect: backlog full"
            time.sleep(0.02)
        except OSError as exc:
            s.close()
            return None, f"connect: {type(exc).__name__}"
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        first = frame_header(nfds, length) + b"\0" * min(send, 4096)
        if nfds:
            socket.send_fds(s, [first], [null] * nfds)
        else:
            s.sendall(first)
        rest = send - min(send, 4096)
        chunk = b"\0" * (1 << 20)
        while rest > 0:
            n = s.send(chunk[:rest])
            rest -= n
        return s, "sent"
    except OSError as exc:
        return s, f"cut: {type(exc).__name__}"
    finally:
        os.close(null)


def kill_everything(procs: Procs, masters: list[Master]) -> None:
    """The masters' trees (workers may have left the group), then every group."""
    pids = set()
    for m in masters:
        pids.update(m.tree())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    procs.kill_all()


def checkout_of(python: str) -> str:
    """Where the sockherd that `python` imports lives."""
    out = subprocess.run([python, "-c", "import sockherd.master, os; "
                          "print(os.path.dirname(os.path.dirname(sockherd.master.__file__)))"],
                         capture_output=True, text=True)
    return out.stdout.strip() or f"? ({out.stderr.strip()[-200:]})"
