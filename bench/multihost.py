#!/usr/bin/env python3
"""multihost: a new app version rolled host by host behind a load balancer
under continuous load, every failed request counted by kind (tracker issue
11 section 2: the multi-host proof). Root only (network namespaces).

    .venv/bin/python bench/multihost.py [--rounds 3] [--modes reload,upgrade,restart]
        [--lb default|retry|both] [--record] [--json rows.json]

Topology (made here, removed in a finally whatever happens, Ctrl-C and TERM
included; a leftover of an earlier crashed run is removed first):

    root namespace: bridge shmh-br 10.251.7.1/24, the client
      |-- veth -- netns shmh-lb  10.251.7.10  haproxy, frontend :8080
      |-- veth -- netns shmh-h1  10.251.7.11  sockherd, app :8000, metrics :9100
      `-- veth -- netns shmh-h2  10.251.7.12  sockherd, app :8000, metrics :9100

Each host: `ip netns exec shmh-hN sockherd run mhapp:app -w 2 --threads 2 -b
10.251.7.1N:8000 --metrics 10.251.7.1N:9100 --runtime-dir DIR
--unready-delay 1.0`, its app (mhapp.py, in a directory of its own)
answering `pid=P v=VERSION host=hN peer=REMOTE_ADDR`. HAProxy in shmh-lb:
roundrobin over both, `option httpchk GET /-/ready` on the metrics port
(inter 200ms, fall 2, rise 2), traffic to the app port with a PROXY
protocol v2 header (`send-proxy-v2`, deploy/haproxy/haproxy.cfg's shape):
each host runs `--proxy-protocol v2 --proxy-allow-from 10.251.7.10`, so the
app sees the client's address (10.251.7.1), not the balancer's; the final
check asks for it (the harness's own direct requests, from a peer not
allowed, are served as themselves). `--lb default` keeps HAProxy's default
retries (3, on connection failures only, same server); `--lb retry` adds
`retry-on conn-failure empty-response` and `option redispatch 1`: a GET is
idempotent, and an empty response is what HAProxy sees when a server closes
an idle pooled backend connection as a request is sent on it (the keep-alive
race); `both` runs every mode under each.

Load: bench/reload_client.c (benchlib.ReloadClient, pointed at the LB's
address), closed loop: --close-conns
connections opening a new connection per request, --ka-conns keep-alive
ones, and one long request (/sleep?1, 1 s) always in flight, all to the
LB's 10.251.7.10:8080. Failures by kind as reload_client counts them:
refused, reset, eof, timeout, non2xx (HAProxy's 502/503 land here),
ka_race, other.

Modes, each with a client of its own, each rolling a new version (the
version number goes up by one per round: each host's mhapp.py rewritten just
before its turn) --rounds times across h1 then h2:
  reload   `sockherd ctl --runtime-dir DIR reload` (synchronous)
  upgrade  `sockherd ctl --runtime-dir DIR upgrade` (synchronous: the new
           image's new generation serves)
  restart  TERM to the master (unready at once; served on for
           --unready-delay s, above the check's fall time, then the drain),
           wait for HAProxy to mark it DOWN and for the master to exit, start
           it fresh, wait for /-/ready and for HAProxy to mark it UP
After each host's roll: the host itself (direct, 32 new connections open at once) must answer
the new version only (every worker: at least 2 pids), and both servers must
be UP in HAProxy before the next host is touched. At the end: every host, and
the LB (both hosts seen), answer the last version.

Exit status 0 when every mode had 0 failures, every roll completed and the
final version answered everywhere; 1 otherwise; 2 for a set-up problem
(not root, no `ip netns`, no haproxy, no gcc, the address range in use).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib as B  # noqa: E402

PREFIX = "shmh"
NET = "10.251.7"
SUBNET = ipaddress.ip_network(f"{NET}.0/24")
BRIDGE = f"{PREFIX}-br"
BRIDGE_IP = f"{NET}.1"
LB = {"ns": f"{PREFIX}-lb", "ip": f"{NET}.10"}
HOSTS = [{"name": "h1", "ns": f"{PREFIX}-h1", "ip": f"{NET}.11"},
         {"name": "h2", "ns": f"{PREFIX}-h2", "ip": f"{NET}.12"}]
NAMESPACES = [LB["ns"]] + [h["ns"] for h in HOSTS]
APP_PORT, METRICS_PORT, LB_PORT = 8000, 9100, 8080
WORKERS, THREADS = 2, 2
KINDS = ("refused", "reset", "eof", "timeout", "non2xx", "ka_race", "other")
MODES = ("reload", "upgrade", "restart")
CHECK_INTER_MS, CHECK_FALL, CHECK_RISE = 200, 2, 2
UNREADY_DELAY = 1.0           # fall * inter = 0.4 s (+ the check's own latency): well above
BAD_RE = re.compile(r"reload refused|upgrade failed|upgrade refused|failed before ready|"
                    r"gave up|no heartbeat|killed|Traceback|CRITICAL")

APP_SRC = '''"""multihost's app: every answer names its process, version and host."""
import os
import time

VERSION = {version}
HOST = {host!r}


def app(environ, start_response):
    if environ.get("PATH_INFO") == "/sleep":
        time.sleep(float(environ.get("QUERY_STRING") or 1))
    body = b"pid=%d v=%d host=%s peer=%s\\n" % (os.getpid(), VERSION, HOST.encode(),
                                                environ["REMOTE_ADDR"].encode())
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]
'''


class SetupError(B.BenchError):
    """Something this machine lacks (exit 2 / a skip in the test)."""


class Busy(SetupError):
    """Another multihost run (the benchmark or the test) holds the lock."""


LOCK_PATH = os.path.join("/run/lock" if os.path.isdir("/run/lock") else tempfile.gettempdir(),
                         "sockherd-multihost.lock")


@contextlib.contextmanager
def exclusive(wait: float):
    """One run at a time on this machine (the names and addresses are fixed,
    and a run starts by removing whatever bears them): an flock, released by
    the kernel if the holder dies, never inherited by the children."""
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Busy(f"another multihost run holds {LOCK_PATH} (waited {wait:g} s)")
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def sh(*argv, check=True, timeout=30) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise B.BenchError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
    return r


# ---- what the machine must have -------------------------------------------------------------
def missing() -> str | None:
    """Why this benchmark cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs, a bridge)"
    if not shutil.which("ip"):
        return "no `ip` (iproute2)"
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns` does not work: {r.stderr.strip()}"
    if not shutil.which("haproxy") and not os.path.exists("/usr/sbin/haproxy"):
        return "no haproxy (sh bench/setup_peers.sh, or apt-get install haproxy)"
    if not shutil.which("gcc"):
        return "no gcc (the load client is C)"
    if not os.path.exists(B.SOCKHERD):
        return f"no {B.SOCKHERD} (sh make.sh test)"
    return None


def haproxy_bin() -> str:
    return shutil.which("haproxy") or "/usr/sbin/haproxy"


# ---- the network ----------------------------------------------------------------------------
def cleanup_net() -> list[str]:
    """Everything of ours (this run's or a crashed one's): the processes in
    our namespaces killed, the namespaces, the bridge and veth ends deleted.
    What it removed, for the log."""
    done = []
    listed = sh("ip", "netns", "list", check=False).stdout
    present = {ln.split()[0] for ln in listed.splitlines() if ln.strip()}
    for ns in NAMESPACES:
        if ns not in present:
            continue
        for _ in range(50):                       # kill until none is left (forks)
            pids = [int(p) for p in sh("ip", "netns", "pids", ns, check=False).stdout.split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        sh("ip", "netns", "del", ns, check=False)
        done.append(f"netns {ns}")
    links = sh("ip", "-o", "link", "show", check=False).stdout
    for m in re.finditer(rf"^\d+: ({PREFIX}-[\w-]+?)(?:@\S+)?:", links, re.M):
        sh("ip", "link", "del", m.group(1), check=False)
        done.append(f"link {m.group(1)}")
    return done


def check_free() -> None:
    """Nothing else on this machine uses 10.251.7.0/24 (after our own cleanup)."""
    addrs = sh("ip", "-4", "-o", "addr", "show").stdout
    for m in re.finditer(r"inet (\S+)", addrs):
        if ipaddress.ip_interface(m.group(1)).network.overlaps(SUBNET):
            raise SetupError(f"{SUBNET} is in use here (address {m.group(1)}); edit NET")
    for line in sh("ip", "-4", "route", "show", "table", "all").stdout.splitlines():
        dst = line.split()[0] if line.split() else ""
        if dst in ("default", "local", "broadcast", "unreachable", "prohibit", "blackhole"):
            dst = line.split()[1] if len(line.split()) > 1 else ""
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if net.prefixlen > 0 and net.overlaps(SUBNET):
            raise SetupError(f"{SUBNET} is routed here already ({line.strip()}); edit NET")


def setup_net() -> None:
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    for node in [LB] + HOSTS:
        ns = node["ns"]
        short = ns.split("-")[1]
        root_end, ns_end = f"{PREFIX}-{short}0", f"{PREFIX}-{short}1"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", root_end, "type", "veth", "peer", "name", ns_end)
        sh("ip", "link", "set", root_end, "master", BRIDGE)
        sh("ip", "link", "set", root_end, "up")
        sh("ip", "link", "set", ns_end, "netns", ns)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{node['ip']}/24", "dev", ns_end)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_end, "up")
    for node in [LB] + HOSTS:                    # the bridge forwards (no STP delay)
        B.wait_for(lambda n=node: tcp_reachable_or_refused(n["ip"], 1), 10,
                   f"{node['ip']} reachable over the bridge", interval=0.05)


def tcp_reachable_or_refused(ip: str, port: int) -> bool:
    """The address answers at L3: a connect is accepted or refused (RST)."""
    try:
        with socket.create_connection((ip, port), timeout=0.3):
            return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


# ---- HTTP helpers (the harness's own requests, never counted) -------------------------------
def http_get(ip: str, port: int, path: str = "/", timeout: float = 2.0) -> tuple[int, str]:
    """(status, body) of one request on a new connection; (0, why) on an error."""
    try:
        with socket.create_connection((ip, port), timeout=timeout) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n".encode())
            data = B.recv_all(s)
    except OSError as e:
        return 0, str(e)
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.\d (\d+)", head)
    return (int(m.group(1)) if m else 0), body.decode("utf-8", "replace")


ANSWER_RE = re.compile(r"pid=(\d+) v=(\d+) host=(\w+)")
PEER_RE = re.compile(r"peer=(\S+)")
CLIENT_IP = f"{NET}.1"          # the root namespace's bridge address: the client's


def client_peers(ip: str, port: int, n: int) -> list[str]:
    """REMOTE_ADDR as the app saw it, for n requests (None for an error)."""
    out = []
    for _ in range(n):
        st, body = http_get(ip, port)
        m = PEER_RE.search(body) if st == 200 else None
        out.append(m.group(1) if m else "error")
    return out


def answers(ip: str, port: int, n: int) -> list[tuple[int, int, str] | None]:
    """n answers (pid, version, host), None for an error, on n connections
    open at once. At once, not one after the other: a worker holding more
    open connections than another (the balancer's idle keep-alive ones,
    after the load) stops accepting until the other catches up
    (worker/gate.py, the balance), so sequential connections there all
    went to the other worker for as long as those idle ones lived (a
    check of "every worker answers" failed for 20 s in CI). Held open
    together, they fill the less loaded worker until the other takes its
    share."""
    socks: list[socket.socket | None] = []
    for _ in range(n):
        try:
            s = socket.create_connection((ip, port), timeout=2.0)
            s.sendall(f"GET / HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n".encode())
            socks.append(s)
        except OSError:
            socks.append(None)
    out: list[tuple[int, int, str] | None] = []
    for s in socks:
        if s is None:
            out.append(None)
            continue
        try:
            with s:
                head, _, body = B.recv_all(s).partition(b"\r\n\r\n")
        except OSError:
            out.append(None)
            continue
        m = ANSWER_RE.search(body.decode("utf-8", "replace")) \
            if re.match(rb"HTTP/1\.\d 200", head) else None
        out.append((int(m.group(1)), int(m.group(2)), m.group(3)) if m else None)
    return out


def verify_version(ip: str, port: int, version: int, n: int = 32,
                   timeout: float = 10.0) -> dict:
    """n answers of `version` with at least WORKERS pids among them (n
    connections open at once: answers()); stale = answers of another
    version (or errors) seen first."""
    stale = []
    deadline = time.monotonic() + timeout
    while True:
        got = answers(ip, port, n)
        bad = [a for a in got if a is None or a[1] != version]
        if not bad and len({a[0] for a in got}) >= min(WORKERS, n):
            return {"ok": True, "stale": stale, "pids": sorted({a[0] for a in got}),
                    "hosts": sorted({a[2] for a in got})}
        stale += bad
        if time.monotonic() > deadline:
            return {"ok": False, "stale": stale[:20], "last": got}
        time.sleep(0.1)


# ---- HAProxy --------------------------------------------------------------------------------
def haproxy_cfg(d: str, lb_mode: str) -> str:
    retry = ("    retry-on conn-failure empty-response\n"
             "    option redispatch 1\n") if lb_mode == "retry" else ""
    # send-proxy-v2: the client's address to the app (its checks go to the
    # metrics port, which HAProxy sends no header to: `check port`)
    servers = "".join(f"    server {h['name']} {h['ip']}:{APP_PORT} send-proxy-v2 "
                      f"check port {METRICS_PORT}\n" for h in HOSTS)
    cfg = os.path.join(d, "haproxy.cfg")
    with open(cfg, "w") as f:
        f.write(f"""global
    nbthread 2
    stats socket {d}/admin.sock mode 600 level admin
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 75s
    timeout check 1s
frontend fe
    bind {LB['ip']}:{LB_PORT}
    default_backend app
backend app
    balance roundrobin
    option httpchk GET /-/ready
    http-check expect status 200
{retry}    default-server inter {CHECK_INTER_MS}ms fastinter {CHECK_INTER_MS}ms downinter {CHECK_INTER_MS}ms fall {CHECK_FALL} rise {CHECK_RISE}
{servers}""")
    return cfg


def haproxy_cmd(sock: str, cmd: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2.0)
        s.connect(sock)
        s.sendall(cmd.encode() + b"\n")
        return B.recv_all(s).decode()


def haproxy_stats(sock: str) -> dict[str, dict]:
    """backend app's servers: their `show stat` columns by name."""
    try:
        text = haproxy_cmd(sock, "show stat")
    except OSError:
        return {}
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        return {}
    cols = lines[0][2:].split(",")
    out = {}
    for ln in lines[1:]:
        row = dict(zip(cols, ln.split(",")))
        if row.get("pxname") == "app" and row.get("svname") in {h["name"] for h in HOSTS}:
            out[row["svname"]] = row
    return out


def server_status(sock: str, name: str) -> str:
    return haproxy_stats(sock).get(name, {}).get("status", "?")


# ---- hosts ----------------------------------------------------------------------------------
class Host:
    def __init__(self, spec: dict, procs: B.Procs, tmp: str):
        self.__dict__.update(spec)
        self.procs = procs
        self.dir = os.path.join(tmp, self.name)
        self.appdir = os.path.join(self.dir, "app")
        self.rundir = os.path.join(self.dir, "run")
        os.makedirs(self.appdir, exist_ok=True)
        self.p: subprocess.Popen | None = None
        self.logs: list[str] = []
        self.version = 0

    def write_app(self, version: int) -> None:
        path = os.path.join(self.appdir, "mhapp.py")
        with open(path + ".tmp", "w") as f:
            f.write(APP_SRC.format(version=version, host=self.name))
        os.replace(path + ".tmp", path)
        shutil.rmtree(os.path.join(self.appdir, "__pycache__"), ignore_errors=True)
        self.version = version

    def argv(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns, B.SOCKHERD, "run", "mhapp:app",
                "-w", str(WORKERS), "--threads", str(THREADS), "--pythonpath", self.appdir,
                "-b", f"{self.ip}:{APP_PORT}", "--metrics", f"{self.ip}:{METRICS_PORT}",
                "--runtime-dir", self.rundir, "--unready-delay", str(UNREADY_DELAY),
                "--hard-stop-after", "20",
                "--proxy-protocol", "v2", "--proxy-allow-from", LB["ip"]]

    def start(self) -> None:
        log = os.path.join(self.dir, f"sockherd{len(self.logs)}.log")
        self.logs.append(log)
        # `ip netns exec` execs the command: the Popen pid is the master's
        self.p = self.procs.start(self.argv(), log_path=log, cwd=self.dir)

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready():
            if self.p.poll() is not None:
                raise B.BenchError(f"{self.name}: sockherd exited with {self.p.returncode}:\n"
                                   + B.read_text(self.logs[-1])[-3000:])
            return http_get(self.ip, METRICS_PORT, "/-/ready", timeout=1.0)[0] == 200
        B.wait_for(ready, timeout, f"{self.name}: /-/ready answering 200", interval=0.05)

    def ctl(self, *words: str, timeout: float = 180.0) -> tuple[float, str]:
        t0 = time.monotonic()
        r = subprocess.run([B.SOCKHERD, "ctl", "--runtime-dir", self.rundir, *words],
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise B.BenchError(f"{self.name}: sockherd ctl {' '.join(words)}: exit "
                               f"{r.returncode}: {(r.stdout + r.stderr).strip()}")
        return time.monotonic() - t0, r.stdout.strip()

    def stop(self, timeout: float = 40.0) -> int | None:
        if self.p is None:
            return None
        return self.procs.stop(self.p, signal.SIGTERM, timeout=timeout)

    def log_bad(self) -> list[str]:
        """The log lines that say something went wrong (a traceback whole)."""
        out = []
        for lg in self.logs:
            lines = B.read_text(lg).splitlines()
            for i, ln in enumerate(lines):
                if BAD_RE.search(ln):
                    block = [ln]
                    if "Traceback" in ln:
                        for nxt in lines[i + 1:i + 30]:
                            block.append(nxt)
                            if not nxt.startswith(" "):
                                break
                    out.append(f"{self.name} ({os.path.basename(lg)}): " + " | ".join(block))
        return out


# ---- one mode -------------------------------------------------------------------------------
class Run:
    """The whole thing: network, haproxy, hosts; run_mode() per mode."""

    def __init__(self, a, log=print, lock_wait: float = 600.0):
        self.a = a
        self.log = log
        self.lock_wait = lock_wait
        self.lock = contextlib.ExitStack()
        self.locked = False
        self.tmp = tempfile.mkdtemp(prefix="multihost-")
        self.procs = B.Procs()
        self.hosts: list[Host] = []
        self.haproxy: subprocess.Popen | None = None
        self.version = 0
        self.lb_mode = ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def setup(self) -> None:
        why = missing()
        if why:
            raise SetupError(why)
        self.lock.enter_context(exclusive(self.lock_wait))
        self.locked = True
        left = cleanup_net()
        if left:
            self.log(f"multihost: removed leftovers of an earlier run: {', '.join(left)}")
        check_free()
        setup_net()
        self.hosts = [Host(h, self.procs, self.tmp) for h in HOSTS]
        self.version = 1
        for h in self.hosts:
            h.write_app(self.version)
            h.start()
        for h in self.hosts:
            h.wait_ready()

    def start_lb(self, lb_mode: str) -> None:
        self.stop_lb()
        self.lb_mode = lb_mode
        d = os.path.join(self.tmp, f"lb-{lb_mode}")
        os.makedirs(d, exist_ok=True)
        self.lb_sock = os.path.join(d, "admin.sock")
        cfg = haproxy_cfg(d, lb_mode)
        self.haproxy = self.procs.start(["ip", "netns", "exec", LB["ns"], haproxy_bin(),
                                         "-db", "-f", cfg],
                                        log_path=os.path.join(d, "haproxy.log"))
        self.wait_all_up(15)

    def stop_lb(self) -> None:
        if self.haproxy is not None:
            if self.procs.stop(self.haproxy, signal.SIGTERM, timeout=10) is None:
                self.haproxy.kill()
                self.haproxy.wait(timeout=10)
            self.haproxy = None

    def wait_all_up(self, timeout: float) -> None:
        def up():
            if self.haproxy.poll() is not None:
                raise B.BenchError(f"haproxy exited with {self.haproxy.returncode}")
            st = haproxy_stats(self.lb_sock)
            return all(st.get(h.name, {}).get("status") == "UP" for h in self.hosts)
        B.wait_for(up, timeout, "haproxy: every server UP", interval=0.05)

    def close(self) -> None:
        try:
            self.procs.kill_all()
        finally:
            try:
                if self.locked:                        # ours to clean only under the lock
                    cleanup_net()
            finally:
                self.lock.close()
                self.locked = False
                if self.a.keep:
                    self.log(f"multihost: kept {self.tmp}")
                else:
                    shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the rolls --
    def roll_host(self, h: Host, mode: str, rec: dict) -> None:
        h.write_app(self.version)
        t0 = time.monotonic()
        step = {"host": h.name, "version": self.version, "t0": t0}
        if mode in ("reload", "upgrade"):
            step["ctl_s"], step["ctl_out"] = h.ctl(mode)
        elif mode == "restart":
            old = h.p
            h.stop(timeout=0)                               # TERM, no wait
            try:
                B.wait_for(lambda: server_status(self.lb_sock, h.name).startswith("DOWN"),
                           10, f"haproxy to mark {h.name} DOWN", interval=0.02)
                step["down_s"] = time.monotonic() - t0
            except B.BenchError as e:
                rec["notes"].append(str(e))
            got = self.procs.stop(old, signal.SIGTERM, timeout=40) if old.poll() is None \
                else old.returncode
            step["exit_s"] = time.monotonic() - t0
            step["exit_status"] = got
            if got != 0:
                rec["notes"].append(f"{h.name}: the master exited with {got} after TERM")
            h.start()
            h.wait_ready()
            step["ready_s"] = time.monotonic() - t0
        v = verify_version(h.ip, APP_PORT, self.version)
        step["verify"] = v
        if not v["ok"]:
            rec["notes"].append(f"{h.name}: v{self.version} not answered by every worker: {v}")
            rec["incomplete"] += 1
        if v["stale"]:
            rec["notes"].append(f"{h.name}: {len(v['stale'])} stale answer(s) after the "
                                f"{mode} completed: {v['stale'][:3]}")
        self.wait_all_up(15)
        step["up_s"] = time.monotonic() - t0
        rec["steps"].append(step)

    def run_mode(self, mode: str) -> dict:
        a = self.a
        rec = {"mode": mode, "lb": self.lb_mode, "rounds": a.rounds, "rolls": 0,
               "incomplete": 0, "notes": [], "steps": [], "first_version": self.version + 1}
        stats0 = haproxy_stats(self.lb_sock)
        client = B.ReloadClient(self.procs, LB_PORT, a.close_conns, a.ka_conns, "/sleep?1",
                                 a.timeout, addr=LB["ip"])
        try:
            time.sleep(a.warmup)
            for _r in range(a.rounds):
                self.version += 1                           # one new version per round
                for h in self.hosts:
                    try:
                        self.roll_host(h, mode, rec)
                        rec["rolls"] += 1
                    except B.BenchError as e:
                        rec["incomplete"] += 1
                        rec["notes"].append(f"{mode} {h.name}: {e}")
                        if h.p is not None and h.p.poll() is not None:
                            self.log(f"multihost: {h.name} died; restarting it")
                            h.start()
                            h.wait_ready()
                            self.wait_all_up(15)
                    time.sleep(a.gap)
            time.sleep(a.settle)
            res = client.stop()
        finally:
            if client.p.poll() is None:
                client.p.kill()
                client.p.wait(timeout=10)
        rec.update(res)
        rec["last_version"] = self.version
        rec["failures"] = sum(res[k] for k in KINDS)
        rec["long_bad"] = res["long_total"] - res["ok_long"]
        rec["fail_lines"] = client.fails[:200]
        stats1 = haproxy_stats(self.lb_sock)
        rec["lb"] = self.lb_mode
        rec["lb_counters"] = {
            h.name: {k: int(stats1.get(h.name, {}).get(k) or 0)
                     - int(stats0.get(h.name, {}).get(k) or 0)
                     for k in ("wretr", "wredis", "eresp", "econ", "hrsp_5xx", "chkdown")}
            for h in self.hosts}
        return rec

    def final_check(self) -> dict:
        out = {"version": self.version, "hosts": {}, "ok": True}
        for h in self.hosts:
            # 20 s: under a busy CI box (pytest -n auto on 2 cores) answers
            # from both workers took longer than 5 s once
            v = verify_version(h.ip, APP_PORT, self.version, timeout=20)
            out["hosts"][h.name] = v["ok"]
            out["ok"] &= v["ok"]
            if not v["ok"]:
                out.setdefault("why", {})[h.name] = {"last": v.get("last"),
                                                     "stale": v.get("stale")}
        via = verify_version(LB["ip"], LB_PORT, self.version, n=16, timeout=5)
        out["lb_ok"] = via["ok"] and via.get("hosts") == sorted(h.name for h in self.hosts)
        out["lb_hosts"] = via.get("hosts")
        out["ok"] &= out["lb_ok"]
        # the PROXY protocol: the app saw the client, never the balancer
        peers = client_peers(LB["ip"], LB_PORT, 16)
        out["client_peers"] = sorted(set(peers))
        out["peers_ok"] = bool(peers) and set(peers) == {CLIENT_IP}
        out["ok"] &= out["peers_ok"]
        return out


def run_all(a, log=print) -> tuple[list[dict], dict]:
    """Every (lb mode, mode) row, and the final check; the network, the
    processes and the temporary directory removed whatever happens."""
    rows = []
    with Run(a, log) as run:
        run.setup()
        lbs = ("default", "retry") if a.lb == "both" else (a.lb,)
        for lb_mode in lbs:
            run.start_lb(lb_mode)
            for mode in a.modes:
                log(f"multihost: lb={lb_mode} mode={mode}: {a.rounds} round(s) over "
                    f"{len(HOSTS)} hosts ...")
                row = run_mode_safe(run, mode, log)
                rows.append(row)
                if "ok" in row:
                    log(f"multihost:   {row['ok']} ok, {row['failures']} failed "
                        + " ".join(f"{k}={row[k]}" for k in KINDS if row[k])
                        + f", rolls {row['rolls']}/{a.rounds * len(HOSTS)}")
        final = run.final_check()
        final["log_bad"] = [ln for h in run.hosts for ln in h.log_bad()][:20]
    return rows, final


def run_mode_safe(run: Run, mode: str, log) -> dict:
    try:
        return run.run_mode(mode)
    except B.BenchError as e:
        log(f"multihost: {mode}: {e}")
        return {"mode": mode, "lb": run.lb_mode, "error": str(e), "notes": [str(e)]}


# ---- report ---------------------------------------------------------------------------------
def report(rows: list[dict], final: dict, a) -> str:
    m = B.machine() if hasattr(B, "machine") else {}
    out = [f"## multihost: a version rolled host by host behind HAProxy (issue 11 §2), "
           f"{time.strftime('%Y-%m-%d')}",
           "",
           f"- `.venv/bin/python bench/multihost.py --rounds {a.rounds} --lb {a.lb}`"
           + (f"; HEAD {m.get('head')} (modified: {m.get('modified')})" if m else ""),
           f"- 2 hosts (netns, veth on a bridge, {SUBNET}), each `sockherd run -w {WORKERS} "
           f"-t {THREADS} --metrics IP:{METRICS_PORT} --unready-delay {UNREADY_DELAY:g}`; "
           f"HAProxy ({haproxy_version()}) in a third netns: roundrobin, `option httpchk GET "
           f"/-/ready` inter {CHECK_INTER_MS}ms fall {CHECK_FALL} rise {CHECK_RISE}; lb "
           f"`default`: HAProxy's default retries (3, connection failures, same server); "
           f"`retry`: + `retry-on conn-failure empty-response`, `option redispatch 1`",
           f"- load to the LB: {a.close_conns} connection-per-request + {a.ka_conns} "
           f"keep-alive connections + 1 long request (1 s) always in flight, closed loop "
           f"(bench/reload_client.c), timeout {a.timeout:g} s",
           f"- a roll: h1 then h2, a new version each; reload = `sockherd ctl reload`, "
           f"upgrade = `sockherd ctl upgrade`, restart = TERM, DOWN in HAProxy, exit, fresh "
           f"start, /-/ready, UP; the next host only once both are UP",
           ""]
    heads = ["lb", "mode", "host rolls", "requests ok", "failures", *KINDS, "long ok/total",
             "longest stall ms", "LB retries/redispatches", "LB 5xx", "LB marked DOWN"]
    body = []
    for r in rows:
        if "ok" not in r:
            body.append([r["lb"], r["mode"], "ERROR", "-", "-", *["-"] * len(KINDS), "-", "-",
                         "-", "-", "-"])
            continue
        lc = r["lb_counters"].values()
        body.append([r["lb"], r["mode"], f"{r['rolls']}/{r['rounds'] * len(HOSTS)}", r["ok"],
                     r["failures"], *[r[k] for k in KINDS], f"{r['ok_long']}/{r['long_total']}",
                     f"{r['max_stall_us'] / 1000:.0f}",
                     f"{sum(c['wretr'] for c in lc)}/{sum(c['wredis'] for c in lc)}",
                     sum(c["hrsp_5xx"] for c in lc), sum(c["chkdown"] for c in lc)])
    out.append(B.table(heads, body))
    out.append("")
    times = []
    for r in rows:
        steps = r.get("steps", [])
        if not steps:
            continue
        key = {"reload": "ctl_s", "upgrade": "ctl_s", "restart": "up_s"}[r["mode"]]
        xs = [s[key] for s in steps if key in s]
        if xs:
            extra = ""
            if r["mode"] == "restart":
                downs = [s["down_s"] for s in steps if "down_s" in s]
                if downs:
                    extra = f", TERM -> DOWN in HAProxy max {max(downs) * 1000:.0f} ms"
            times.append(f"{r['lb']}/{r['mode']}: per host {min(xs):.2f}-{max(xs):.2f} s"
                         f"{extra}")
    if times:
        out.append("- time per host roll (ctl command; restart: TERM to UP again): "
                   + "; ".join(times))
    out.append(f"- final: v{final['version']} answered by every worker of every host: "
               f"{'yes' if all(final['hosts'].values()) else 'NO ' + str(final['hosts'])}; "
               f"through the LB from {final.get('lb_hosts')}: "
               f"{'yes' if final.get('lb_ok') else 'NO'}")
    out.append(f"- client addresses the app saw through the LB (PROXY protocol v2): "
               f"{final.get('client_peers')} (the client is {CLIENT_IP}): "
               f"{'yes' if final.get('peers_ok') else 'NO'}")
    for r in rows:
        for n in r.get("notes", [])[:10]:
            out.append(f"- note ({r['lb']}/{r['mode']}): {n}")
        fl = r.get("fail_lines", [])
        if fl:
            out.append(f"- failures ({r['lb']}/{r['mode']}), first ones (kind, request type, "
                       f"responses before on its connection, bytes, errno; when, after the "
                       f"start of which host's roll): "
                       + "; ".join(f"{k} {rest} at +{when(r, t)}" for k, t, rest in fl[:8]))
    for ln in final.get("log_bad", [])[:10]:
        out.append(f"- sockherd log: {ln}")
    return "\n".join(out) + "\n"


def when(r: dict, t: float) -> str:
    """t (the client's CLOCK_MONOTONIC) as seconds after the start of the last
    host roll begun before it."""
    prev = [s for s in r.get("steps", []) if s.get("t0", 1e18) <= t]
    if not prev:
        return f"{t:.3f} (before the first roll)"
    return f"{t - prev[-1]['t0']:.3f} s of {prev[-1]['host']}'s roll {prev[-1]['version']}"


def haproxy_version() -> str:
    try:
        r = subprocess.run([haproxy_bin(), "-v"], capture_output=True, text=True, timeout=10)
        m = re.search(r"HAProxy version (\S+)", r.stdout)
        return f"HAProxy {m.group(1)}" if m else "HAProxy ?"
    except OSError:
        return "HAProxy missing"


def passed(rows: list[dict], final: dict, a) -> bool:
    return (final["ok"] and all("ok" in r and r["failures"] == 0 and r["incomplete"] == 0
                                and r["rolls"] == a.rounds * len(HOSTS)
                                and r["long_bad"] == 0 for r in rows)
            and not final.get("log_bad"))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rolls over every host per mode")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="comma-separated among reload,upgrade,restart")
    ap.add_argument("--lb", choices=("default", "retry", "both"), default="default")
    ap.add_argument("--close-conns", type=int, default=8)
    ap.add_argument("--ka-conns", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=5.0, help="client timeout, s")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--gap", type=float, default=0.5, help="pause between host rolls, s")
    ap.add_argument("--settle", type=float, default=1.5)
    ap.add_argument("--record", action="store_true", help="append the summary to "
                    "bench/RESULTS.md")
    ap.add_argument("--json", help="write every row (and the final check) here")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    a = ap.parse_args(argv)
    a.modes = [m for m in a.modes.split(",") if m]
    for m in a.modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}")
    return a


def _term(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, _term)         # the finally clean-up runs on TERM too
    try:
        rows, final = run_all(a)
    except SetupError as e:
        print(f"multihost: cannot run here: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("multihost: interrupted; everything removed", file=sys.stderr)
        return 130
    text = report(rows, final, a)
    print()
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "final": final}, f, indent=1, default=str)
    if a.record:
        with open(os.path.join(HERE, "RESULTS.md"), "a") as f:
            f.write("\n" + text)
    return 0 if passed(rows, final, a) else 1


if __name__ == "__main__":
    sys.exit(main())
