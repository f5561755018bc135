"""Shared pieces of the issue-7 benchmarks (accept_bench, idle_bench, echo_bench).

Processes: every process a benchmark starts goes through `Procs`, a context
manager whose exit kills and reaps whatever is still alive (the process group
each was started in, then the process itself), whatever happened. Waits are
polls with a deadline (`wait_for`). Ports are ephemeral (`free_port`); files
go to temporary directories.
"""
from __future__ import annotations

import argparse
import glob
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOCKHERD = os.path.join(ROOT, ".venv", "bin", "sockherd")
PEERS_VENV = os.path.join(HERE, ".venv-peers")
PEERS_PY = os.path.join(PEERS_VENV, "bin", "python")
APPS = os.path.join(HERE, "apps")
BUILD = os.path.join(HERE, "build")
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    pass


def arg_parser(doc: str) -> argparse.ArgumentParser:
    """A bench script's parser from its docstring: the first paragraph is
    the description, what follows the second (the usage lines, which
    argparse prints itself) the epilog, laid out as written."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                   epilog=doc.split("\n\n", 2)[2],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def run_main(main, name: str) -> None:
    """A bench script's exit: main()'s status, or 2 and the reason for a
    BenchError (a set-up problem)."""
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"{name}: {e}", file=sys.stderr)
        sys.exit(2)


# ---- waiting ----------------------------------------------------------------------------
def wait_for(pred, timeout: float, what: str, interval: float = 0.02):
    """Polls pred() until it returns something truthy; BenchError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    """An ephemeral port: bind port 0 in a probe socket, read it, close it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def recv_all(sock) -> bytes:
    """Everything a socket sends until its end (EOF)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def can_connect(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


# ---- processes --------------------------------------------------------------------------
class Procs:
    """Starts processes (each in a new session, so its whole tree can be
    killed by the group id it was given) and kills + reaps them all on exit."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def __enter__(self):
        return self

    def start(self, argv, *, log_path=None, stdout=None, env=None, cwd=None) -> subprocess.Popen:
        err = open(log_path, "wb") if log_path else subprocess.DEVNULL
        try:
            p = subprocess.Popen(argv, stdout=stdout if stdout is not None else err,
                                 stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                 start_new_session=True)
        finally:
            if log_path:
                err.close()
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Sends sig to p alone and polls for its exit; None if still alive."""
        if p.poll() is None:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return p.poll()

    def kill_all(self) -> None:
        for p in self.procs:
            # the group first (children a dead parent left behind), then p
            for target in ("group", "proc"):
                try:
                    if target == "group":
                        os.killpg(p.pid, signal.SIGKILL)
                    elif p.poll() is None:
                        p.kill()
                except (ProcessLookupError, PermissionError):
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                print(f"warning: pid {p.pid} not reaped after SIGKILL", file=sys.stderr)

    def __exit__(self, *exc):
        self.kill_all()
        return False


# ---- sockherd -----------------------------------------------------------------------------
def sockherd_argv(app: str, port: int, *, workers: int, threads: int, groups: int = 1,
                  extra=()) -> list[str]:
    return [SOCKHERD, "run", app, "--interface", "stream", "--pythonpath", APPS,
            "-w", str(workers), "--threads", str(threads), "--thread-groups", str(groups),
            "-b", f"127.0.0.1:{port}", *extra]


def read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def wait_sockherd_ready(p: subprocess.Popen, log_path: str, workers: int,
                        timeout: float = 30.0) -> list[int]:
    """Polls the master's log until every worker logged ready; the worker pids."""
    def ready():
        if p.poll() is not None:
            raise BenchError(f"sockherd exited with {p.returncode} before ready:\n"
                             + read_text(log_path)[-3000:])
        pids = re.findall(r"worker \d+\.\d+: ready, pid (\d+)", read_text(log_path))
        return [int(x) for x in pids] if len(pids) >= workers else None
    return wait_for(ready, timeout, f"{workers} sockherd workers ready")


TOTALS_RE = re.compile(r"\[worker (\d+)\] INFO totals: (.*)")


def parse_totals(log_text: str) -> dict[int, dict[str, int]]:
    out = {}
    for pid, rest in TOTALS_RE.findall(log_text):
        out[int(pid)] = {k: int(v) for k, v in (kv.split("=") for kv in rest.split())}
    return out


# ---- C clients ----------------------------------------------------------------------------
def build_c(name: str, flags=(), libs=()) -> str:
    """Compiles bench/NAME.c with gcc -O2 (and flags; libs after the source,
    as the linker wants them) into bench/build/NAME (when the source or a
    header of bench/, c_ref.h, closed_loop.h, is newer than the binary);
    returns the binary's path."""
    src = os.path.join(HERE, name + ".c")
    os.makedirs(BUILD, exist_ok=True)
    out = os.path.join(BUILD, name)
    newest = max(os.path.getmtime(p) for p in [src, *glob.glob(os.path.join(HERE, "*.h"))])
    if not os.path.exists(out) or os.path.getmtime(out) < newest:
        cmd = ["gcc", "-O2", "-Wall", *flags, "-o", out + ".tmp", src, *libs]
        subprocess.run(cmd, check=True, timeout=120)
        os.replace(out + ".tmp", out)
    return out


def run_json_client(argv, timeout: float) -> dict:
    """Runs a C client that prints one line of key=value pairs; its dict."""
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise BenchError(f"{argv[0]} exited {r.returncode}: {r.stderr.strip()}")
    line = r.stdout.strip().splitlines()[-1]
    out = {}
    for kv in line.split():
        k, v = kv.split("=", 1)
        try:
            out[k] = int(v)
        except ValueError:
            out[k] = float(v)
    return out


# ---- /proc ---------------------------------------------------------------------------------
def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def tree(root: int) -> list[int]:
    """root and its descendants, root first."""
    kids = children_map()
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(sorted(kids.get(pid, [])))
    return out


def _stat_fields(path: str) -> list[str]:
    with open(path) as f:
        s = f.read()
    return s[s.rindex(")") + 2:].split()


def task_sample(pid: int, tid: int) -> dict:
    base = f"/proc/{pid}/task/{tid}"
    vol = nonvol = 0
    with open(base + "/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                nonvol = int(line.split()[1])
    st = _stat_fields(base + "/stat")
    try:
        with open(base + "/wchan") as f:
            wchan = f.read().strip()
    except OSError:
        wchan = "?"
    try:
        with open(base + "/comm") as f:
            comm = f.read().strip()
    except OSError:
        comm = "?"
    return {"vol": vol, "nonvol": nonvol, "ticks": int(st[11]) + int(st[12]),
            "wchan": wchan, "comm": comm}


def proc_sample(pid: int) -> dict:
    """One process: its CPU ticks (all threads, dead ones included) and each
    live thread's context switches."""
    st = _stat_fields(f"/proc/{pid}/stat")
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    tasks = {}
    for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")):
        try:
            tasks[tid] = task_sample(pid, tid)
        except OSError:
            pass
    return {"ticks": int(st[11]) + int(st[12]), "cmd": cmd, "tasks": tasks}


def tree_sample(root: int) -> dict[int, dict]:
    out = {}
    for pid in tree(root):
        try:
            out[pid] = proc_sample(pid)
        except OSError:
            pass
    return out


def tree_delta(a: dict[int, dict], b: dict[int, dict], seconds: float) -> dict:
    """Wake-ups (voluntary + nonvoluntary context switches) and CPU of every
    process present at both samples, with per-process and per-thread rows."""
    procs = []
    total_wake = total_ticks = 0
    for pid in a:
        if pid not in b:
            continue
        threads = []
        pw = 0
        for tid, t0 in a[pid]["tasks"].items():
            t1 = b[pid]["tasks"].get(tid)
            if t1 is None:
                continue
            w = (t1["vol"] - t0["vol"]) + (t1["nonvol"] - t0["nonvol"])
            pw += w
            threads.append({"tid": tid, "wake": w, "vol": t1["vol"] - t0["vol"],
                            "nonvol": t1["nonvol"] - t0["nonvol"],
                            "ticks": t1["ticks"] - t0["ticks"], "wchan": t1["wchan"],
                            "comm": t1["comm"]})
        ticks = b[pid]["ticks"] - a[pid]["ticks"]
        total_wake += pw
        total_ticks += ticks
        procs.append({"pid": pid, "cmd": a[pid]["cmd"], "wake": pw, "ticks": ticks,
                      "threads": threads})
    gone = sorted(set(a) - set(b))
    new = sorted(set(b) - set(a))
    return {"seconds": seconds, "wake": total_wake, "wake_per_s": total_wake / seconds,
            "cpu_s": total_ticks / CLK_TCK, "procs": procs, "gone": gone, "new": new}


# ---- machine ------------------------------------------------------------------------------
def machine() -> dict:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no",
                            "--", "master", "worker", "fdcore", "ipc"],
                           capture_output=True, text=True).stdout.split()
    dirty = [d for d in dirty if len(d) > 2]
    return {"nproc": os.cpu_count(), "kernel": platform.release(), "cpu": cpu,
            "python": platform.python_version(), "head": head,
            "modified": " ".join(dirty) or "none"}


def header(title: str) -> str:
    m = machine()
    cmd = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.executable, ROOT)
                                             if sys.executable.startswith(ROOT) else sys.executable,
                                             os.path.relpath(os.path.abspath(sys.argv[0]), ROOT),
                                             *sys.argv[1:]])
    load = os.getloadavg()
    return (f"### {title}\n\n"
            f"- command (from the repository root): `{cmd}`\n"
            f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n"
            f"- machine: nproc={m['nproc']}, kernel {m['kernel']}, CPU `{m['cpu']}`, "
            f"load average before {load[0]:.2f}\n"
            f"- sockherd: git {m['head']}, modified in master/ worker/ fdcore/ ipc/: "
            f"{m['modified']}\n")


def table(headers: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def tempdir(prefix: str) -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix=prefix)


def check_peers_venv(*modules: str) -> None:
    """The peers' venv exists and imports `modules` (a venv made by an older
    setup_peers.sh may lack one: uvicorn then dies at start, seen only as a
    server never ready)."""
    if not os.path.exists(PEERS_PY):
        raise BenchError(f"{PEERS_PY} missing: run `sh bench/setup_peers.sh` first")
    for m in modules:
        if subprocess.run([PEERS_PY, "-c", f"import {m}"], capture_output=True).returncode:
            raise BenchError(f"{PEERS_PY} cannot import {m}: run `sh bench/setup_peers.sh` "
                             "(it installs what is missing)")


def check_sockherd() -> None:
    if not os.path.exists(SOCKHERD):
        raise BenchError(f"{SOCKHERD} missing: run `sh make.sh test` (or `make setup`) first")


def footer() -> str:
    load = os.getloadavg()
    return f"\n- load average after: {load[0]:.2f} (1 min), {load[1]:.2f} (5 min)"


def box_ticks() -> tuple[int, int]:
    """(busy ticks of the whole machine, of which irq + softirq) from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    total = sum(v[:8])
    return total - idle, v[5] + v[6]


def busy_now(seconds: float = 1.0) -> float:
    """The machine's busy cores over the next `seconds` (/proc/stat)."""
    b0, _ = box_ticks()
    time.sleep(seconds)
    b1, _ = box_ticks()
    return (b1 - b0) / CLK_TCK / seconds


class BoxMeter:
    """Machine-wide busy cores and the CPU of reaped children (the client)
    over a window: tells whether something else took the cores."""

    def __enter__(self):
        import resource
        self._r = resource
        self.b0, self.i0 = box_ticks()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.c0 = ru.ru_utime + ru.ru_stime
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.seconds = time.monotonic() - self.t0
        b1, i1 = box_ticks()
        self.busy_cores = (b1 - self.b0) / CLK_TCK / self.seconds
        self.irq_cores = (i1 - self.i0) / CLK_TCK / self.seconds
        ru = self._r.getrusage(self._r.RUSAGE_CHILDREN)
        self.children_cpu = ru.ru_utime + ru.ru_stime - self.c0
        return False


class ReloadClient:
    """bench/reload_client.c in the background (the closed-loop load of the
    reload benchmarks) until stop(); its stdout read by a thread: newpid and
    fail lines as they come, the RESULT line's figures at the end. addr:
    the IPv4 address it connects to (default 127.0.0.1)."""

    def __init__(self, procs: Procs, port: int, close_conns: int, ka_conns: int,
                 long_path: str, timeout: float, addr: str = ""):
        import threading

        self.newpids: list[tuple[int, float]] = []
        self.lastsent: dict[int, float] = {}   # pid -> the latest request it answered began
        self.lastconn: dict[int, float] = {}   # pid -> the latest new connection it answered
        self.fails: list[tuple[str, float, str]] = []
        self.result: dict | None = None
        target = f"{addr}:{port}" if addr else str(port)
        self.p = subprocess.Popen(
            [build_c("reload_client"), target, str(close_conns), str(ka_conns), long_path,
             str(timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        procs.procs.append(self.p)
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.p.stdout:
            f = line.split()
            if not f:
                continue
            with self.lock:
                if f[0] == "newpid":
                    self.newpids.append((int(f[1]), float(f[2])))
                elif f[0] == "lastsent":
                    self.lastsent[int(f[1])] = float(f[2])
                    if len(f) > 3:
                        self.lastconn[int(f[1])] = float(f[3])
                elif f[0] == "fail":
                    self.fails.append((f[1], float(f[2]), " ".join(f[3:])))
                elif f[0] == "RESULT":
                    d = {}
                    for kv in f[1:]:
                        k, v = kv.split("=", 1)
                        d[k] = float(v) if "." in v else int(v)
                    self.result = d

    def pids_since(self, t: float) -> list[tuple[int, float]]:
        with self.lock:
            return [(p, tt) for p, tt in self.newpids if tt >= t]

    def stop(self, timeout: float = 15.0) -> dict:
        """EOF on its stdin: it prints RESULT and exits (TERM, then KILL,
        if it does not within timeout). The RESULT figures; BenchError
        without them."""
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=10)
        self.reader.join(timeout=5)
        err = self.p.stderr.read()
        self.p.stdout.close()
        self.p.stderr.close()
        if self.result is None:
            raise BenchError(f"reload_client gave no RESULT (exit {self.p.returncode}): "
                             + err[-2000:])
        return self.result
