"""Issue 19: a live master abused the nine ways its findings name, measured.

Each abuse starts a fresh `sockherd run` master of the checkout under test
(-w 2, --metrics, --handoff-socket, a runtime dir of its own under a temporary
directory), abuses it for a few seconds and measures the master: its threads,
open fds (/proc/PID/fd) and RSS (VmRSS), base -> peak; whether it survives;
the latency of /-/ready on the metrics address meanwhile; the latency of a
control `status`; the time to respawn a killed worker; and what each finding
is about (requests ok / failed / refused under load, masters serving...).
Whatever happens, every process it started is killed at the end of each
abuse (their process groups, and the masters' trees).

Run it with the Python of the checkout under test (bench/master_abuse.sh does):

    bench/master_abuse.sh [PATH_TO_CHECKOUT]          # every abuse, ~2-3 min
    bench/master_abuse.sh /path --only 2,5 --json out.json

An abuse that needs what a checkout does not have reports "n/a". The
figures for before and after issue 19 are in bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from abuselib import (FD_BATCH, READY_LINE, Background, Load, Master, ReadyProber, Sampler, checkout_of,  # noqa: E402
                      counts, ctl, get, handoff_session, kill_everything, parent,
                      ready_probe, write_app, write_broken_python)
from benchlib import Procs, wait_for  # noqa: E402

PY = sys.executable


def ctl_text(outcome: tuple) -> str:
    what, took, reply = outcome
    text = f"{what} in {took * 1000:.0f} ms"
    if what == "error" and reply:
        text += f" ({reply.get('error', '')[:60]})"
    return text


def abuse_1_duplicate_ready(procs, work):
    """App code writes a second Ready on its worker's channel, under load."""
    m = Master(procs, PY, work).started()
    with Sampler(m.pid) as s, ReadyProber(m.mport) as r, Load(m.port) as load:
        wait_for(lambda: load.ok > 20, 10, "load")
        victim = get(m.port, "/dup-ready").split()[-1]
        t0 = time.monotonic()
        while time.monotonic() - t0 < 4 and m.alive():
            time.sleep(0.05)
        after = load.ok
        wait_for(lambda: load.ok > after + 10 or not m.alive(), 3, "serving")
    replaced = m.count(rf"misbehaves.*") > 0 and int(victim) not in m.workers()
    return {"master": m.exit_text(), **s.row(), "/-/ready": r.summary(),
            "what": f"load {load.counts()}; offender pid {victim} "
                    f"{'replaced' if replaced else 'not replaced'}; "
                    f"workers now {len(m.workers())}"}


def abuse_2_dripping_metrics(procs, work, n=500):
    """500 clients drip one header line every 0.5 s at the metrics address."""
    m = Master(procs, PY, work).started()
    drippers, started = [], set()
    with Sampler(m.pid) as s, ReadyProber(m.mport) as r:
        try:
            for _ in range(n):
                c = socket.socket()
                c.bind(("127.0.0.2", 0))
                c.setblocking(False)
                c.connect_ex(("127.0.0.1", m.mport))
                drippers.append(c)
            end = time.monotonic() + 6
            while time.monotonic() < end:
                for c in drippers:
                    try:
                        c.send(b"X-Drip: 1\r\n" if c in started else b"GET /-/ready HTTP/1.1\r\n")
                        started.add(c)
                    except OSError:
                        pass
                time.sleep(0.5)
            held = counts(m.pid)
        finally:
            for c in drippers:
                c.close()
    slow, socks = 0, []
    try:                                    # a burst of 50 connects: SYNs dropped?
        for _ in range(50):
            t0 = time.monotonic()
            socks.append(socket.create_connection(("127.0.0.1", m.mport), timeout=5,
                                                  source_address=("127.0.0.2", 0)))
            slow += time.monotonic() - t0 >= 0.9
    except OSError:
        slow = -1
    finally:
        for c in socks:
            c.close()
    tracebacks = m.text().count("Traceback")
    return {"master": m.exit_text(), **s.row(), "/-/ready": r.summary(),
            "what": f"{n} drippers for 6 s: threads {held['threads'] if held else '?'} at the "
                    f"end; 50-connect burst: {slow if slow >= 0 else 'error'} waited >= 0.9 s "
                    f"(SYN retry); {tracebacks} tracebacks in the master's log"}


class Squeeze(Background):
    """For the duration of a with block, the master's fd table kept full
    the ways finding 3 names. RLIMIT_NOFILE set to `limit` (prlimit, soft
    and hard); 500 dripping metrics clients (a header line every 2 s: the
    old listener's timeout is per recv, 10 s); then hand-off sessions passing
    fds in frames never finished (252 a session, then fewer as the table
    fills), topped off every 20 ms (an old hand-off session expires 10 s
    after its accept; a killed worker's fds are freed)."""

    def __init__(self, m: Master, limit: int = 1024):
        super().__init__()
        self.m, self.limit = m, limit
        self.held: list[socket.socket] = []
        self.drippers: list[socket.socket] = []
        self.reached = ""

    def fds(self) -> int:
        return (counts(self.m.pid) or {}).get("fds", 0)

    def fill(self) -> None:
        """Exactly the fds still free: a session passing free - 1 of them
        (its connection is one), a bare connection for the last; never more,
        so that no batch is dropped and nothing is freed meanwhile that the
        master could take (a respawn slipped through such a window)."""
        for _ in range(64):
            before = self.fds()
            free = self.limit - before
            if free <= 0 or self._stop.is_set():
                return
            nfds = min(FD_BATCH, free - 1)
            sock, _ = handoff_session(self.m.handoff, nfds=nfds, length=64, send=8)
            if sock is None:
                return
            try:
                wait_for(lambda: self.fds() >= before + 1 + nfds, 0.5, "fds received",
                         interval=0.01)
                self.held.append(sock)
            except Exception:  # noqa: BLE001 - refused (a fixed master): no more this way
                if self.fds() > before:
                    self.held.append(sock)
                else:
                    sock.close()
                return

    def drip(self, first: bool = False) -> None:
        for c in self.drippers:
            try:
                c.send(b"GET /-/ready HTTP/1.1\r\n" if first else b"X-Drip: 1\r\n")
            except OSError:
                pass

    def __enter__(self):
        import resource

        resource.prlimit(self.m.pid, resource.RLIMIT_NOFILE, (self.limit, self.limit))
        for _ in range(500):
            c = socket.socket()
            c.bind(("127.0.0.2", 0))
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", self.m.mport))
            self.drippers.append(c)
        time.sleep(0.5)
        self.drip(first=True)
        by_drippers = self.fds()
        self.fill()
        self.reached = (f"fds {self.fds()}/{self.limit} squeezed ({by_drippers} after the "
                        f"500 drippers)")
        return super().__enter__()

    def _run(self):
        dripped = time.monotonic()
        while not self._stop.wait(0.02):
            if time.monotonic() - dripped > 2:
                self.drip()
                dripped = time.monotonic()
            self.fill()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        for c in self.held + self.drippers:
            c.close()


def abuse_3a_squeeze_respawn(procs, work, limit=1024, squeezed_for=10, after=6):
    """A worker killed unsqueezed (the reference respawn time); then the fd
    squeeze and another worker killed: is it respawned while squeezed? Once
    the squeeze ends, does its slot come back?"""
    m = Master(procs, PY, work).started()
    ready_before = m.count(READY_LINE)
    os.kill(m.workers()[0], signal.SIGKILL)
    t_kill = time.monotonic()
    wait_for(lambda: m.count(READY_LINE) > ready_before, 15, "the unsqueezed respawn")
    plain = f"{time.monotonic() - t_kill:.1f} s unsqueezed; "
    wait_for(lambda: ready_probe(m.mport, 1)[0] == "200", 10, "/-/ready 200 again")
    ready_before = m.count(READY_LINE)
    with Sampler(m.pid) as s:
        with Squeeze(m, limit) as squeezed:
            os.kill(m.workers()[0], signal.SIGKILL)
            t_kill = time.monotonic()
            with ReadyProber(m.mport, timeout=2) as r:
                while time.monotonic() - t_kill < squeezed_for and m.alive() \
                        and m.count(READY_LINE) == ready_before:
                    time.sleep(0.05)
            respawned = m.count(READY_LINE) > ready_before
            respawn = plain + (f"{time.monotonic() - t_kill:.1f} s squeezed" if respawned
                               else f"not within {squeezed_for} s squeezed")
        if not respawned and m.alive():
            t_free = time.monotonic()
            while time.monotonic() - t_free < after and m.alive() \
                    and m.count(READY_LINE) == ready_before:
                time.sleep(0.05)
            respawned = m.count(READY_LINE) > ready_before
            respawn += (f"; {time.monotonic() - t_free:.1f} s after the squeeze ended"
                        if respawned else f"; not within {after} s after the squeeze ended")
    text = m.text()
    gave_up = "gave up" in text or "given up" in text
    emfile = text.count("Errno 24") + text.count("Too many open files")
    return {"master": m.exit_text(), **s.row(), "/-/ready": r.summary(), "respawn": respawn,
            "what": f"{squeezed.reached}; slot given up: {'yes' if gave_up else 'no'}; {emfile} "
                    f"EMFILE lines in the log; workers at the end {len(m.workers())}"}


def abuse_3b_squeeze_ctl(procs, work, limit=1024):
    """The fd squeeze, then `ctl status` (and /-/ready meanwhile)."""
    m = Master(procs, PY, work).started()
    with Sampler(m.pid) as s:
        with Squeeze(m, limit) as squeezed, ReadyProber(m.mport, timeout=2) as r:
            status = ctl(m.endpoint, "status", timeout=3)
            time.sleep(0.5)
    after = ctl(m.endpoint, "status", timeout=3) if m.alive() else None
    return {"master": m.exit_text(), **s.row(), "/-/ready": r.summary(),
            "ctl status": f"squeezed: {ctl_text(status)}; after: "
                          + (ctl_text(after) if after else "no master"),
            "what": f"{squeezed.reached}; "
                    + ("libzmq assert in the log; " if "Assertion" in m.text()
                       or "ipc_listener" in m.text() else "")
                    + f"workers at the end {len(m.workers())}"}


def abuse_4_handoff(procs, work, fd_sessions=20, big_sessions=40):
    """Hand-off sessions: 20 each passing 252 fds in an unfinished frame;
    then 40 each sending 16 MB of a frame never finished."""
    m = Master(procs, PY, work).started()
    held, outcome = [], {}
    with Sampler(m.pid) as s, ReadyProber(m.mport) as r:
        try:
            for _ in range(fd_sessions):
                sock, what = handoff_session(m.handoff, nfds=252, length=64, send=8)
                outcome[what] = outcome.get(what, 0) + 1
                if sock is not None:
                    held.append(sock)
            time.sleep(0.5)
            fds_held = (counts(m.pid) or {}).get("fds", "?")
            for c in held:
                c.close()
            held.clear()
            big = 16 * 1024 * 1024
            for _ in range(big_sessions):
                sock, what = handoff_session(m.handoff, length=big, send=big - 1)
                outcome["16MB " + what] = outcome.get("16MB " + what, 0) + 1
                if sock is not None:
                    held.append(sock)
            time.sleep(1)
            rss_held = (counts(m.pid) or {}).get("rss", 0)
        finally:
            for c in held:
                c.close()
    return {"master": m.exit_text(), **s.row(), "/-/ready": r.summary(),
            "what": f"{fd_sessions} sessions x 252 fds: master fds {fds_held} 0.5 s after "
                    f"(base {s.base['fds']}); {big_sessions} sessions x 16 MB: RSS "
                    f"{rss_held:.0f} MB 1 s after; clients: "
                    + ", ".join(f"{k} {v}" for k, v in sorted(outcome.items()))}


def abuse_5_envelope(procs, work, frames=80, mb=10):
    """One control message of `frames` x `mb` MB envelope frames, never read."""
    import zmq

    need = 2 * frames * mb * 1024 * 1024 * 2
    avail = _mem_available()
    scaled = ""
    while need > avail // 2 and frames > 1:
        frames //= 2
        need //= 2
        scaled = f" (scaled down: MemAvailable {avail >> 20} MB)"
    m = Master(procs, PY, work).started()
    ctx = zmq.Context.instance()
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    with Sampler(m.pid) as s, ReadyProber(m.mport) as r:
        try:
            d.connect(m.endpoint)
            chunk = b"\0" * (mb * 1024 * 1024)
            d.send_multipart([chunk] * frames + [b'{"command": "status"}'], copy=False)
            time.sleep(3)                           # a client that does not read
            rss_unread = (counts(m.pid) or {}).get("rss", 0)
            if d.poll(3000, zmq.POLLIN):
                reply = d.recv_multipart()
                answer = (f"answered: {len(reply)} frames, "
                          f"{sum(len(f) for f in reply) >> 20} MB echoed, "
                          f"{reply[-1][:70].decode(errors='replace')}")
            else:
                answer = "no reply within 3 s"
            status = ctl(m.endpoint, "status")
        finally:
            d.close()
    return {"master": m.exit_text(), **s.row(), "/-/ready": r.summary(),
            "ctl status": ctl_text(status),
            "what": f"{frames} x {mb} MB frames{scaled}: RSS {rss_unread:.0f} MB while unread; "
                    f"{answer}"}


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def abuse_6_half_frame(procs, work):
    """A worker sends half a frame, the rest 4.5 s later: ctl status meanwhile."""
    m = Master(procs, PY, work).started()
    lat = []
    with Sampler(m.pid) as s, ReadyProber(m.mport) as r:
        get(m.port, "/half-frame")
        end = time.monotonic() + 5.5
        while time.monotonic() < end:
            lat.append(ctl(m.endpoint, "status", timeout=7))
            time.sleep(0.1)
    worst = max(lat, key=lambda x: x[1])
    bad = [x[0] for x in lat if x[0] != "ok"]
    return {"master": m.exit_text(), **s.row(), "/-/ready": r.summary(),
            "ctl status": f"max {worst[1] * 1000:.0f} ms over {len(lat)} requests"
                          + (f", {len(bad)} not ok" if bad else ""),
            "what": f"half a heartbeat frame, the rest 4.5 s later; workers "
                    f"{len(m.workers())}"}


def abuse_7_reload_crashing(procs, work, seconds=55, after_exit=3):
    """ctl reload to a generation that crashes 1 s after its first request,
    under load for `seconds`, or until `after_exit` s after the master
    exited (on a loaded machine the crash-respawn cycles take 20-30 s before
    the slots are given up): requests ok / failed / refused, the master at
    the end."""
    import threading

    m = Master(procs, PY, work).started()
    reply = {}
    died = None
    with Sampler(m.pid) as s, ReadyProber(m.mport) as r, Load(m.port) as load:
        wait_for(lambda: load.ok > 20, 10, "load")
        write_app(work, "crash")

        def reload():
            reply["r"] = ctl(m.endpoint, "reload", timeout=seconds)
        t = threading.Thread(target=reload, daemon=True)
        t0 = time.monotonic()
        t.start()
        while time.monotonic() - t0 < seconds:
            if died is None and not m.alive():
                died = time.monotonic() - t0
            if died is not None and time.monotonic() - t0 > died + after_exit:
                break
            time.sleep(0.1)
        ran = time.monotonic() - t0
        t.join(1)
        tail = [a for when, a in load.answers if when > time.monotonic() - 2]
    answer = reply.get("r")
    if answer:
        res = answer[2] or {}
        said = res.get("result") if answer[0] == "ok" else res.get("error")
        said = f"{answer[0]} after {answer[1]:.1f} s: {str(said)[:80]}"
    else:
        said = "no answer"
    versions = sorted({a.split()[0] for a in tail})
    return {"master": m.exit_text() + (f" {died:.0f} s after the reload" if died else ""),
            **s.row(), "/-/ready": r.summary(),
            "what": f"{ran:.0f} s of load: {load.counts()}; ctl reload: {said}; "
                    f"serving at the end: {', '.join(versions) or 'nothing'}"}


def abuse_8_upgrade_broken(procs, work, seconds=8):
    """USR2 to an image that passes the pre-exec check and fails at start-up
    (the python setting, read again at the upgrade), under load."""
    config = os.path.join(work, "sockherd.toml")
    with open(config, "w") as f:
        f.write("")
    m = Master(procs, PY, work, config=config).started()
    broken = write_broken_python(work, PY)
    with open(config, "w") as f:
        f.write(f'python = "{broken}"\n')
    with Sampler(m.pid) as s, ReadyProber(m.mport) as r, Load(m.port) as load:
        wait_for(lambda: load.ok > 20, 10, "load")
        os.kill(m.pid, signal.SIGUSR2)
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            time.sleep(0.1)
        tail = [a for when, a in load.answers if when > time.monotonic() - 2]
    text = m.text()
    faulted = "bench: this image fails at start-up" in text
    refused = "upgrade refused" in text or "upgrade failed" in text
    return {"master": m.exit_text(), **s.row(), "/-/ready": r.summary(),
            "what": f"{seconds} s of load: {load.counts()}; the broken image ran: "
                    f"{'yes' if faulted else 'no'}; upgrade reported failed/refused: "
                    f"{'yes' if refused else 'no'}; pid {m.pid} "
                    f"{'alive' if m.alive() else 'gone'}; answers in the last 2 s: {len(tail)}"}


def abuse_9_two_takeovers(procs, work, seconds=10):
    """Two `run --takeover` at once against one hand-off socket."""
    old = Master(procs, PY, work, name="old").started()
    extra = ("--takeover", old.handoff)
    b = Master(procs, PY, work, name="takeover-a", extra=extra, metrics=False,
               bind=f"127.0.0.1:{old.port}", runtime=old.runtime)
    c = Master(procs, PY, work, name="takeover-b", extra=extra, metrics=False,
               bind=f"127.0.0.1:{old.port}", runtime=old.runtime)
    with Sampler(old.pid) as s, Load(old.port) as load:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            time.sleep(0.1)
        serving = {}
        for _ in range(60):
            try:
                pid = int(get(old.port, timeout=2).split()[-1])
            except (OSError, ValueError):
                continue
            serving[parent(pid)] = serving.get(parent(pid), 0) + 1
    names = {old.pid: "old", b.pid: "takeover A", c.pid: "takeover B"}
    won = [names[x.pid] for x in (b, c) if "takeover: serving" in x.text()]
    masters = [names.get(p, f"pid {p}") for p in serving]
    return {"master": f"old {old.exit_text('exited')}, A {b.exit_text('exited')}, "
                      f"B {c.exit_text('exited')}",
            **s.row(), "/-/ready": "n/a",
            "what": f"{len(serving)} master(s) serving 60 requests ({', '.join(masters)}); "
                    f"'takeover: serving' logged by {', '.join(won) or 'none'}; "
                    f"load {load.counts()}"}


ABUSES = {
    "1": ("duplicate Ready from app code", abuse_1_duplicate_ready),
    "2": ("500 dripping metrics clients", abuse_2_dripping_metrics),
    "3a": ("fd squeeze (RLIMIT_NOFILE 1024) + a worker killed", abuse_3a_squeeze_respawn),
    "3b": ("fd squeeze (RLIMIT_NOFILE 1024) + ctl status", abuse_3b_squeeze_ctl),
    "4": ("hand-off sessions passing fds / 16 MB frames", abuse_4_handoff),
    "5": ("80 x 10 MB-frame control envelope", abuse_5_envelope),
    "6": ("half a frame from a worker", abuse_6_half_frame),
    "7": ("reload to an app crashing 1 s after its first request", abuse_7_reload_crashing),
    "8": ("upgrade to an image failing at start-up", abuse_8_upgrade_broken),
    "9": ("two simultaneous takeovers", abuse_9_two_takeovers),
}
COLUMNS = ["master", "threads", "fds", "rss", "/-/ready", "ctl status", "respawn", "what"]


def run_one(key: str, keep: str | None) -> dict:
    title, fn = ABUSES[key]
    if keep:
        os.makedirs(keep, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"abuse{key}-", dir=keep)
    write_app(work)
    procs = Procs()
    masters_before = []
    t0 = time.monotonic()
    orig_master = Master.__init__

    def tracked(self, *a, **kw):               # every master, for the final kill
        orig_master(self, *a, **kw)
        masters_before.append(self)
    Master.__init__ = tracked
    try:
        row = fn(procs, work)
        if "ctl status" not in row:
            m = masters_before[0]
            row["ctl status"] = ("after: " + ctl_text(ctl(m.endpoint, "status"))
                                 if m.alive() else "n/a")
    except Exception as exc:  # noqa: BLE001 - one abuse that cannot run says why
        row = {"master": "n/a", "what": f"n/a: {type(exc).__name__}: {str(exc)[:300]}"}
    finally:
        Master.__init__ = orig_master
        kill_everything(procs, masters_before)
        if keep is None:
            subprocess.run(["rm", "-rf", work])
    row["abuse"] = f"{key}. {title}"
    row["seconds"] = round(time.monotonic() - t0, 1)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated abuse numbers (default: all)")
    ap.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    ap.add_argument("--keep", metavar="DIR", help="keep each abuse's directory (logs) under DIR")
    ns = ap.parse_args()
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))     # 500 drippers
    wanted = [k.strip() for k in ns.only.split(",") if k.strip()]
    keys = [a for a in ABUSES if not wanted or a in wanted or a.rstrip("ab") in wanted]
    checkout = checkout_of(PY)
    head = subprocess.run(["git", "-C", checkout, "log", "-1", "--format=%h %cI"],
                          capture_output=True, text=True).stdout.strip()
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for k in keys:
        row = run_one(k, ns.keep)
        rows.append(row)
        print(f"[{row['seconds']:5.1f} s] {row['abuse']}: {row.get('master')} | "
              + " | ".join(f"{c} {row[c]}" for c in COLUMNS[1:] if c in row), flush=True)
    load1 = os.getloadavg()
    cmd = "bench/master_abuse.sh " + shlex.quote(checkout) + (
        f" --only {ns.only}" if ns.only else "")
    print()
    print(f"### master_abuse: {checkout} at {head}")
    print()
    print(f"- date: {started}; command: `{cmd}`")
    print(f"- machine: {os.cpu_count()} CPUs, kernel {platform.release()}, Python "
          f"{platform.python_version()}; load average {load0[0]:.1f} before, "
          f"{load1[0]:.1f} after")
    print()
    print("| abuse | master | threads | fds | RSS MB | /-/ready | ctl status | respawn | what |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        cells = [row["abuse"]] + [str(row.get(c, "")) or "" for c in COLUMNS]
        print("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"checkout": checkout, "head": head, "date": started, "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
