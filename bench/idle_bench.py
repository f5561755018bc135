#!/usr/bin/env python3
"""idle_bench: what an idle `sockherd run` costs (wake-ups and CPU of the whole
process tree), idle and while draining, against nginx, granian, gunicorn and
uvicorn in the same run.

    .venv/bin/python bench/idle_bench.py [--seconds 60] [--only a,b,...]

Each scenario starts a server (2 workers), waits until it serves, lets it
settle (--settle, 3 s), then samples /proc over --seconds: wake-ups = the sum
over every process and every thread of the tree of the voluntary +
nonvoluntary context switch deltas (/proc/PID/task/TID/status), per second;
CPU = utime + stime deltas (/proc/PID/stat, 10 ms ticks). A per-process and
per-thread breakdown (with the kernel function each thread sleeps in, wchan)
shows who wakes.

Scenarios (--only takes these names):

  sockherd         sockherd run echo:Echo --interface stream -w 2 --threads 4, other
                   settings default (the heartbeat interval used is printed)
  sockherd-nohb    the same with --heartbeat-interval 3600 --heartbeat-timeout
                   7200: heartbeats out of the window; the difference to
                   `sockherd` is what the heartbeats cost
  sockherd-drain   --idle-grace 600 --hard-stop-after 600, 8 idle connections
                   (connected, nothing sent), SIGTERM to the master, draining
                   confirmed (both workers logged "draining", master and workers
                   alive, the 8 connections open, new connections refused),
                   measured, confirmed again, then the clients close and the
                   master must exit 0 with both workers drained
  nginx            worker_processes 2, daemon off, master_process on, a conf in a
                   temporary directory (return 200)
  granian          granian --interface wsgi --workers 2 (bench/apps/peer_apps.py)
  gunicorn         gunicorn -w 2 (sync workers, the same WSGI app)
  uvicorn          uvicorn --workers 2 (an ASGI app)
  nginx-drain      first: QUIT with one idle keep-alive connection (what nginx
                   does with it, how long the drain lasts); then, to hold the
                   draining state, QUIT with a download in flight to a client
                   that does not read (send_timeout 600s), measured
  gunicorn-drain   TERM with a request in flight (the app sleeps 600 s;
                   --graceful-timeout 600 --timeout 900), measured
  uvicorn-drain    TERM with a request in flight (asyncio.sleep(600)), measured
  granian-drain    TERM with a request in flight (the WSGI app sleeps 600 s)

A draining state that ends before the window is over is reported as such
(how long it held), never padded.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import benchlib as B

ALL = ("sockherd", "sockherd-nohb", "sockherd-drain", "nginx", "granian", "gunicorn",
       "uvicorn", "nginx-drain", "gunicorn-drain", "uvicorn-drain", "granian-drain")


# ---- helpers ---------------------------------------------------------------------------
def http_get(port: int, path: str = "/", timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            return data.startswith(b"HTTP/1.1 200") or data.startswith(b"HTTP/1.0 200")
    except OSError:
        return False


def start_request(port: int, path: str) -> socket.socket:
    """Sends a request and leaves it in flight (the response is not read)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return s


def listen_queue(port: int) -> int | None:
    """Connections waiting in the accept queue of the listener on port
    (rx_queue of the LISTEN entry in /proc/net/tcp); None if no listener."""
    hexport = f"{port:04X}"
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            if parts[1].endswith(":" + hexport) and parts[3] == "0A":
                return int(parts[4].split(":")[1], 16)
    return None


def is_open(s: socket.socket) -> bool:
    """True if the peer has neither closed nor reset s (nothing is consumed)."""
    prev = s.gettimeout()
    s.setblocking(False)
    try:
        data = s.recv(1, socket.MSG_PEEK)
        return bool(data)            # data waiting: still open
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        s.settimeout(prev)


def server_side_owner(c: socket.socket | int, port: int, pids: list[int]) -> int | None:
    """The pid among pids holding the accepted end of client socket c (or of
    the client port c): the /proc/net/tcp row port -> c's port gives the
    inode, /proc/PID/fd the holder."""
    lport = f"{c if isinstance(c, int) else c.getsockname()[1]:04X}"
    sport = f"{port:04X}"
    inode = None
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            if parts[1].endswith(":" + sport) and parts[2].endswith(":" + lport):
                inode = parts[9]
                break
    if not inode or inode == "0":
        return None
    want = f"socket:[{inode}]"
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == want:
                        return pid
                except OSError:
                    pass
        except OSError:
            pass
    return None


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
        return st[st.rindex(")") + 2] != "Z"
    except OSError:
        return False


def live_tree(root: int) -> list[int]:
    """root and its descendants that are not zombies (exited, not yet reaped)."""
    return [pid for pid in B.tree(root) if alive(pid)]


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def window(root: int, seconds: float, watch: list[int] | None = None) -> float | None:
    """The measuring (or settling) window: polls once a second for its length;
    returns how long into it the first watched process died (None: none did)."""
    watch = watch if watch is not None else live_tree(root)
    t0 = time.monotonic()
    end = t0 + seconds
    while True:
        for pid in watch:
            if not alive(pid):
                return time.monotonic() - t0
        left = end - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(1.0, left))


def measure(root: int, a, watch: list[int] | None = None) -> dict:
    s0 = B.tree_sample(root)
    t0 = time.monotonic()
    died = window(root, a.seconds, watch)
    s1 = B.tree_sample(root)
    d = B.tree_delta(s0, s1, time.monotonic() - t0)
    d["died_after"] = died
    return d


def wait_tree(root: int, procs: int, timeout: float = 30) -> list[int]:
    return B.wait_for(lambda: (lambda t: t if len(t) >= procs else None)(B.tree(root)),
                      timeout, f"{procs} processes under pid {root}")


def wait_http(p, port: int, log: str, timeout: float = 30) -> None:
    def ok():
        if p.poll() is not None:
            raise B.BenchError(f"exited with {p.returncode}: {B.read_text(log)[-2000:]}")
        return http_get(port)
    B.wait_for(ok, timeout, f"HTTP 200 on port {port}", interval=0.1)


def in_nanosleep(root: int) -> bool:
    for pid in B.tree(root):
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/wchan") as f:
                    if "nanosleep" in f.read():
                        return True
        except OSError:
            pass
    return False


def settle(root: int, a) -> None:
    window(root, a.settle)


def sockherd_default(key: str):
    out = subprocess.run([os.path.join(B.ROOT, ".venv", "bin", "python"), "-c",
                          "from sockherd.master.settings import SETTINGS as S; "
                          f"print([s.default for s in S if s.key == {key!r}][0])"],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or "?"


def versions() -> str:
    out = []
    try:
        r = subprocess.run(["nginx", "-v"], capture_output=True, text=True, timeout=10)
        out.append(r.stderr.strip().replace("nginx version: ", ""))
    except OSError:
        out.append("nginx: missing")
    if os.path.exists(B.PEERS_PY):
        r = subprocess.run([B.PEERS_PY, "-c", "import importlib.metadata as m; print(' '.join("
                            "f'{p}/{m.version(p)}' for p in ('granian','gunicorn','uvicorn',"
                            "'uvloop')))"], capture_output=True, text=True, timeout=60)
        out.append(r.stdout.strip())
    return ", ".join(out)


# ---- scenarios ---------------------------------------------------------------------------
def sc_sockherd(procs, tmp, a, extra=(), label="sockherd"):
    port = B.free_port()
    log = os.path.join(tmp, f"{label}.log")
    p = procs.start(B.sockherd_argv("echo:Echo", port, workers=2, threads=a.threads,
                                    extra=[*a.sockherd_extra, *extra]), log_path=log)
    B.wait_sockherd_ready(p, log, 2)
    wait_tree(p.pid, 3)
    settle(p.pid, a)
    d = measure(p.pid, a)
    rc = procs.stop(p, timeout=30)
    d["note"] = f"exit {rc} after TERM"
    if rc != 0:
        d["note"] += " (expected 0): " + B.read_text(log)[-500:]
    return d


def sc_sockherd_drain(procs, tmp, a):
    port = B.free_port()
    log = os.path.join(tmp, "sockherd-drain.log")
    p = procs.start(B.sockherd_argv("echo:Echo", port, workers=2, threads=a.threads,
                                    extra=[*a.sockherd_extra, "--idle-grace", "600",
                                           "--hard-stop-after", "600"]), log_path=log)
    workers = B.wait_sockherd_ready(p, log, 2)
    clients = []
    try:
        # --idle-conns connections opened one after the other (each accepted
        # before the next: where the kernel puts them at low load); then, as a
        # worker without connections drains at once and exits, bursts of 32
        # concurrent connects until each worker holds its half, and the
        # surplus is closed (the server closes its end on EOF) so that
        # --idle-conns stay, split evenly; all accepted before TERM closes
        # the listeners
        def owner_of(c):
            return B.wait_for(lambda: server_side_owner(c, port, workers), 10,
                              "a worker to accept the connection")
        by_worker: dict[int, list[socket.socket]] = {w: [] for w in workers}
        for _ in range(a.idle_conns):
            c = socket.create_connection(("127.0.0.1", port), timeout=5)
            clients.append(c)
            by_worker[owner_of(c)].append(c)
        sequential = "/".join(str(len(v)) for v in by_worker.values())
        half = max(1, a.idle_conns // 2)
        bursts = 0
        while not all(len(v) >= half for v in by_worker.values()):
            if len(clients) >= 512:
                raise B.BenchError("512 connections, still a worker without its half: "
                                   + "/".join(str(len(v)) for v in by_worker.values()))
            burst = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(32)]
            for c in burst:
                c.setblocking(False)
                try:
                    c.connect(("127.0.0.1", port))
                except BlockingIOError:
                    pass
            clients.extend(burst)
            for c in burst:
                by_worker[owner_of(c)].append(c)
            bursts += 1
        keep = [c for v in by_worker.values() for c in v[:half]]
        surplus = [c for c in clients if c not in keep]
        surplus_ports = [c.getsockname()[1] for c in surplus]
        for c in surplus:
            c.close()
        clients = keep
        kept_split = "/".join(str(min(len(v), half)) for v in by_worker.values())
        # the workers closed the surplus connections' ends (EOF -> close)
        B.wait_for(lambda: all(server_side_owner(lp, port, workers) is None
                               for lp in surplus_ports), 10,
                   "the workers to close the surplus connections")
        B.wait_for(lambda: listen_queue(port) == 0, 10, "the accept queue to empty")
        os.kill(p.pid, signal.SIGTERM)

        def draining():
            text = B.read_text(log)
            return ("graceful stop" in text
                    and all(f"[worker {w}] INFO draining" in text for w in workers))
        B.wait_for(draining, 10, "both workers to log 'draining'")
        refused = not B.can_connect(port)
        state0 = (alive(p.pid), [alive(w) for w in workers], sum(is_open(c) for c in clients))
        if not (state0[0] and all(state0[1]) and state0[2] == len(clients)):
            raise B.BenchError(f"not draining as expected: master alive {state0[0]}, "
                               f"workers alive {state0[1]}, open connections {state0[2]}:\n"
                               + B.read_text(log)[-2000:])
        settle(p.pid, a)
        d = measure(p.pid, a, watch=[p.pid, *workers])
        state1 = (alive(p.pid), [alive(w) for w in workers], sum(is_open(c) for c in clients))
        held = state1[0] and all(state1[1]) and state1[2] == len(clients)
        nconns = len(clients)
        # end of the drain: the clients go, the workers drain, the master exits
        t0 = time.monotonic()
        for c in clients:
            c.close()
        clients = []
        try:
            B.wait_for(lambda: p.poll() is not None, 20, "the master to exit after the clients "
                       "closed")
        except B.BenchError:
            pass
        took = time.monotonic() - t0
        text = B.read_text(log)
        drained = len(re.findall(r"INFO drained: no connection left", text))
        d["note"] = (f"{nconns} idle connections (per worker: "
                     f"{kept_split}; the first {a.idle_conns}, opened one after the other, "
                     f"went {sequential}; then {bursts} burst(s) of 32 concurrent connects, "
                     f"surplus closed); new connections "
                     f"{'refused' if refused else 'ACCEPTED'} while draining; after the window: "
                     f"master alive {state1[0]}, workers alive {state1[1]}, "
                     f"{state1[2]}/{nconns} connections open -> held: {held}; "
                     f"clients closed -> master exit {p.poll()} after {took:.2f} s, "
                     f"{drained}/2 workers 'drained'")
        d["held"] = held
        return d
    finally:
        for c in clients:
            c.close()


def nginx_conf(tmp: str, port: int) -> str:
    www = os.path.join(tmp, "www")
    os.makedirs(www, exist_ok=True)
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""
daemon off;
master_process on;
worker_processes 2;
user root;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_timeout 600s;
    send_timeout 600s;
    sendfile on;
    server {{
        listen 127.0.0.1:{port};
        root {www};
        location = / {{ return 200 "ok\\n"; }}
    }}
}}
""")
    return conf


def start_nginx(procs, tmp, name):
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    port = B.free_port()
    conf = nginx_conf(d, port)
    log = os.path.join(d, "stderr.log")
    p = procs.start(["nginx", "-p", d, "-c", conf, "-e", os.path.join(d, "error.log")],
                    log_path=log)
    wait_http(p, port, log)
    wait_tree(p.pid, 3)
    return p, port, d


def sc_nginx(procs, tmp, a):
    p, port, _ = start_nginx(procs, tmp, "nginx")
    settle(p.pid, a)
    d = measure(p.pid, a)
    procs.stop(p, signal.SIGQUIT, timeout=30)
    return d


def sc_nginx_drain(procs, tmp, a):
    notes = []
    # 1. an idle keep-alive connection
    p, port, _ = start_nginx(procs, tmp, "nginx-ka")
    ka = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        ka.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        resp = ka.recv(4096)
        if b" 200 " not in resp:
            raise B.BenchError(f"nginx keep-alive request: {resp!r}")
        t0 = time.monotonic()
        os.kill(p.pid, signal.SIGQUIT)
        try:
            B.wait_for(lambda: not is_open(ka), 10, "nginx to close the keep-alive connection")
            closed = f"closed by nginx after {(time.monotonic() - t0) * 1000:.0f} ms"
        except B.BenchError:
            closed = "still open after 10 s"
        try:
            B.wait_for(lambda: p.poll() is not None, 30, "nginx to exit")
            gone = f"nginx exited ({p.returncode}) after {(time.monotonic() - t0) * 1000:.0f} ms"
        except B.BenchError:
            gone = "nginx still running 30 s after QUIT"
        notes.append(f"QUIT with an idle keep-alive connection: the connection was {closed}, "
                     f"{gone}: with idle connections only, nginx's draining state cannot be held")
    finally:
        ka.close()
    # 2. a download in flight to a client that does not read
    p, port, d = start_nginx(procs, tmp, "nginx-dl")
    big = os.path.join(d, "www", "big.bin")
    with open(big, "wb") as f:
        f.truncate(1 << 30)                           # sparse: 1 GiB of zeros, no disk
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        head = s.recv(512)
        if b" 200 " not in head:
            raise B.BenchError(f"nginx download: {head[:200]!r}")
        workers = B.tree(p.pid)[1:]
        os.kill(p.pid, signal.SIGQUIT)

        def one_left():
            left = [w for w in workers if alive(w)]
            return left if len(left) == 1 else None
        try:
            left = B.wait_for(one_left, 10, "the idle nginx worker to exit")
        except B.BenchError:
            left = [w for w in workers if alive(w)]
        titles = [cmdline(w) for w in left]
        settle(p.pid, a)
        m = measure(p.pid, a, watch=[p.pid, *left])
        held = alive(p.pid) and all(alive(w) for w in left) and is_open(s)
        notes.append(f"QUIT with a download in flight (client not reading, send_timeout 600s): "
                     f"the idle worker exited, {len(left)} left ({'; '.join(titles)}), the "
                     f"master waits; held through the window: {held}")
        m["note"] = " | ".join(notes)
        m["held"] = held
        return m
    finally:
        s.close()


def sc_granian(procs, tmp, a, drain=False):
    port = B.free_port()
    log = os.path.join(tmp, f"granian{'-drain' if drain else ''}.log")
    p = procs.start([os.path.join(B.PEERS_VENV, "bin", "granian"), "--interface", "wsgi",
                     "--workers", "2", "--host", "127.0.0.1", "--port", str(port),
                     "--working-dir", B.APPS, "--no-access-log", "peer_apps:wsgi"],
                    log_path=log, cwd=B.APPS)
    return _python_peer(procs, p, port, log, a, drain, "granian", wait_sleep=True)


def sc_gunicorn(procs, tmp, a, drain=False):
    port = B.free_port()
    log = os.path.join(tmp, f"gunicorn{'-drain' if drain else ''}.log")
    extra = ["--graceful-timeout", "600", "--timeout", "900"] if drain else []
    p = procs.start([os.path.join(B.PEERS_VENV, "bin", "gunicorn"), "-w", "2", "-b",
                     f"127.0.0.1:{port}", "--chdir", B.APPS, *extra, "peer_apps:wsgi"],
                    log_path=log)
    return _python_peer(procs, p, port, log, a, drain, "gunicorn", wait_sleep=True)


def sc_uvicorn(procs, tmp, a, drain=False):
    port = B.free_port()
    log = os.path.join(tmp, f"uvicorn{'-drain' if drain else ''}.log")
    p = procs.start([os.path.join(B.PEERS_VENV, "bin", "uvicorn"), "--workers", "2", "--host",
                     "127.0.0.1", "--port", str(port), "--app-dir", B.APPS, "--no-access-log",
                     "peer_apps:asgi"], log_path=log)
    return _python_peer(procs, p, port, log, a, drain, "uvicorn", wait_sleep=False)


def _python_peer(procs, p, port, log, a, drain, name, wait_sleep):
    """The rest of a gunicorn, granian or uvicorn scenario once started: idle,
    or draining with a request in flight to peer_apps' /sleep (TERM)."""
    wait_http(p, port, log)
    wait_tree(p.pid, 3)
    if not drain:
        settle(p.pid, a)
        d = measure(p.pid, a)
        procs.stop(p, timeout=30)
        return d
    return drain_with_request(procs, p, port, log, a, name, signal.SIGTERM,
                              "/sleep?600", wait_sleep=wait_sleep)


def drain_with_request(procs, p, port, log, a, name, sig, path, wait_sleep):
    """A request in flight (the app sleeps), then sig to the main process:
    measures whatever stays; says what the server did and how long it held."""
    before = live_tree(p.pid)
    s = start_request(port, path)
    try:
        B.wait_for(lambda: listen_queue(port) == 0, 10, "the request to be accepted")
        if wait_sleep:
            B.wait_for(lambda: in_nanosleep(p.pid), 10, "the app to be sleeping")
        else:
            window(p.pid, 1.0)                 # the ASGI app awaits: nothing to poll for
        os.kill(p.pid, sig)
        t0 = time.monotonic()
        # the idle worker(s) leave; the one with the request should stay
        try:
            B.wait_for(lambda: len(live_tree(p.pid)) < len(before) or p.poll() is not None, 15,
                       f"{name}: the idle worker to exit")
        except B.BenchError:
            pass
        if p.poll() is not None:
            held = False
            d = {"seconds": 0, "wake": 0, "wake_per_s": 0.0, "cpu_s": 0.0, "procs": [],
                 "gone": before, "new": [], "died_after": 0.0}
            d["note"] = (f"{Bsig(sig)} with a request in flight: {name} exited "
                         f"({p.returncode}) after {time.monotonic() - t0:.1f} s, the request "
                         f"{'was answered/closed' if not is_open(s) else 'left open'}: "
                         f"draining state not held")
            d["held"] = False
            return d
        left = live_tree(p.pid)
        settle(p.pid, a)
        d = measure(p.pid, a, watch=left)
        held = all(alive(x) for x in left) and is_open(s)
        what = (f"{Bsig(sig)} with a request in flight (app sleeping 600 s): "
                f"{len(before)} -> {len(left)} processes "
                f"({'; '.join(cmdline(x)[:60] for x in left)}); ")
        if d["died_after"] is not None:
            what += (f"a process exited {d['died_after'] + a.settle:.1f} s after the signal: "
                     f"draining held only that long; ")
        what += f"held through the window: {held}"
        d["note"] = what
        d["held"] = held
        return d
    finally:
        s.close()


def Bsig(sig) -> str:
    return signal.Signals(sig).name


# ---- report ------------------------------------------------------------------------------
def role(pid: int, root: int, cmd: str) -> str:
    if pid == root:
        r = "main"
    else:
        r = "child"
    m = re.match(r"(sockherd: \w+ [\d.]*|nginx: [\w ]+)", cmd)
    short = m.group(1) if m else os.path.basename(cmd.split()[0]) if cmd else "?"
    if "multiprocessing" in cmd:
        short += " (mp " + ("spawn" if "spawn_main" in cmd else "helper") + ")"
    return f"{r}: {short}"


def main() -> int:
    ap = B.arg_parser(__doc__)
    ap.add_argument("--seconds", type=float, default=60.0, help="measured window (60)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds before each window (3)")
    ap.add_argument("--only", default=",".join(ALL), help="scenarios, comma-separated "
                    f"(default: all: {','.join(ALL)})")
    ap.add_argument("--threads", "--threads", type=int, default=4, help="sockherd threads (4)")
    ap.add_argument("--idle-conns", type=int, default=8,
                    help="idle connections held during sockherd-drain (8)")
    ap.add_argument("--heartbeat-interval", type=float, default=None,
                    help="pass this --heartbeat-interval to the sockherd and sockherd-drain "
                         "scenarios (default: sockherd's own default)")
    ap.add_argument("--json", help="also write the raw results here")
    a = ap.parse_args()
    a.sockherd_extra = ([] if a.heartbeat_interval is None
                        else ["--heartbeat-interval", str(a.heartbeat_interval)])
    names = [n.strip() for n in a.only.split(",") if n.strip()]
    for n in names:
        if n not in ALL:
            raise SystemExit(f"unknown scenario {n}; known: {', '.join(ALL)}")
    B.check_sockherd()
    if any(not n.startswith("sockherd") for n in names):
        B.check_peers_venv()
    hb_default = sockherd_default("heartbeat_interval")
    hb_used = a.heartbeat_interval if a.heartbeat_interval is not None else hb_default
    head = B.header("idle_bench: wake-ups and CPU of an idle server tree")
    vers = versions()
    runs = {
        "sockherd": lambda pr, t: sc_sockherd(pr, t, a),
        "sockherd-nohb": lambda pr, t: sc_sockherd(pr, t, a, extra=[
            "--heartbeat-interval", "3600", "--heartbeat-timeout", "7200"],
            label="sockherd-nohb"),
        "sockherd-drain": lambda pr, t: sc_sockherd_drain(pr, t, a),
        "nginx": lambda pr, t: sc_nginx(pr, t, a),
        "granian": lambda pr, t: sc_granian(pr, t, a),
        "gunicorn": lambda pr, t: sc_gunicorn(pr, t, a),
        "uvicorn": lambda pr, t: sc_uvicorn(pr, t, a),
        "nginx-drain": lambda pr, t: sc_nginx_drain(pr, t, a),
        "gunicorn-drain": lambda pr, t: sc_gunicorn(pr, t, a, drain=True),
        "uvicorn-drain": lambda pr, t: sc_uvicorn(pr, t, a, drain=True),
        "granian-drain": lambda pr, t: sc_granian(pr, t, a, drain=True),
    }
    results = {}
    for n in names:
        print(f"# {n} ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        with B.Procs() as procs, B.tempdir(f"idle_bench-{n}-") as tmp:
            try:
                d = runs[n](procs, tmp)
            except B.BenchError as exc:
                d = {"error": str(exc)}
        results[n] = d
        summary = {k: v for k, v in d.items() if k != "procs"}
        print(f"#   {time.monotonic() - t0:.0f} s: {summary}", file=sys.stderr, flush=True)

    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1, default=str)

    def fmt(n):
        d = results.get(n, {"error": "not run"})
        if "error" in d:
            return None
        return d

    print(head)
    print(f"- window: {a.seconds:g} s after {a.settle:g} s of settling; wake-ups = voluntary + "
          f"nonvoluntary context switches of every thread of the tree; CPU = utime + stime")
    print(f"- sockherd: -w 2 --threads {a.threads}, heartbeat interval used: {hb_used} s (sockherd's "
          f"default: {hb_default} s); sockherd-nohb: --heartbeat-interval 3600")
    print(f"- peers: {vers}\n")
    idle = [n for n in names if not n.endswith("-drain")]
    drains = [n for n in names if n.endswith("-drain")]
    base_idle = fmt("sockherd") if "sockherd" in results else None
    base_drain = fmt("sockherd-drain") if "sockherd-drain" in results else None

    def row(n, base):
        d = results[n]
        if "error" in d:
            return [n, "-", "-", "-", "-", "-", "ERROR: " + d["error"][:300].replace("\n", " ")]
        nproc = len(d["procs"])
        nthr = sum(len(p["threads"]) for p in d["procs"])
        ratio = (f"{d['wake_per_s'] / base['wake_per_s']:.1f}"
                 if base and base.get("wake_per_s") else "-")
        note = d.get("note", "")
        if d.get("died_after") is not None and "held" not in d:
            note += f" a process exited {d['died_after']:.1f} s into the window"
        return [n, f"{nproc}/{nthr}", f"{d['wake_per_s']:.2f}", ratio,
                f"{d['cpu_s'] * 1000:.0f}", f"{d['cpu_s'] / max(d['seconds'], 1e-9) * 100:.3f}",
                note.replace("|", "/")]

    hdr = ["server", "processes/threads", "wake-ups/s", "vs sockherd", "CPU ms in window",
           "CPU %", "notes"]
    if idle:
        print("Idle:\n")
        print(B.table(hdr, [row(n, base_idle) for n in idle]))
        print()
    if drains:
        print("Draining (vs sockherd-drain):\n")
        print(B.table(hdr, [row(n, base_drain) for n in drains]))
        print()
    if fmt("sockherd") and fmt("sockherd-nohb"):
        on, off = results["sockherd"], results["sockherd-nohb"]
        diff = on["wake_per_s"] - off["wake_per_s"]
        try:
            per = diff * float(hb_used)
        except ValueError:
            per = float("nan")
        print(f"Heartbeat-driven wake-ups (sockherd - sockherd-nohb): {diff:.2f}/s, i.e. "
              f"{per:.1f} wake-ups per {hb_used} s heartbeat round (2 workers); "
              f"with heartbeats out of the window the tree makes {off['wake_per_s']:.2f}/s.\n")
    print("Per process (wake-ups/s; the threads that woke, as tid:wchan:wake-ups in the "
          "window; threads that never woke are counted, not listed):\n")
    prow = []
    for n in names:
        d = results[n]
        if "error" in d:
            continue
        root = d["procs"][0]["pid"] if d["procs"] else 0
        for p in d["procs"]:
            woke = [t for t in p["threads"] if t["wake"]]
            quiet = len(p["threads"]) - len(woke)
            desc = ", ".join(f"{t['tid']}:{t['wchan']}:{t['wake']}" for t in
                             sorted(woke, key=lambda t: -t["wake"])[:6])
            if len(woke) > 6:
                desc += f", ... ({len(woke) - 6} more)"
            prow.append([n, role(p["pid"], root, p["cmd"]), p["pid"],
                         f"{p['wake'] / d['seconds']:.2f}", f"{p['ticks'] * 1000 // B.CLK_TCK}",
                         f"{len(p['threads'])} ({quiet} never woke)", desc or "-"])
    print(B.table(["scenario", "process", "pid", "wake-ups/s", "CPU ms", "threads",
                   "threads that woke"], prow))
    print(B.footer())
    return 0 if all("error" not in d for d in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
