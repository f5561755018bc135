"""Adversarial review of the control channel (ipc/control.py, master/control.py,
master/commands, master/ctl.py, master/inspect.py and the supervisor's hooks).

Two kinds of tests live here:
* findings: each FAILS on the code as reviewed and names the fault in its
  docstring (the fix is in the review report);
* guards (names start with test_guard_): behaviour that holds now and must
  keep holding (garbage never crashes the master, one reply per request,
  no fd growth, CURVE refusals...).

Every test runs real masters (at most two at once) and real ZeroMQ clients;
each client socket is closed with linger 0, each process reaped by the
`master` fixture."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from test_control import ctl, curve_master, ok_json
from test_reload import write_app
from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


# ---- helpers -------------------------------------------------------------------------------

def _endpoint(tmp_path: Path) -> str:
    return f"ipc://{tmp_path / 'run' / 'control'}"


class Client:
    """A raw ZeroMQ client of the control ROUTER (DEALER or REQ), closed
    with linger 0 whatever happens."""

    def __init__(self, tmp_path: Path | None, kind: int = zmq.DEALER,
                 endpoint: str | None = None, curve: tuple | None = None):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(kind)
        self.sock.linger = 0
        if curve is not None:                     # (public, secret, server public)
            (self.sock.curve_publickey, self.sock.curve_secretkey,
             self.sock.curve_serverkey) = curve
        if kind == zmq.DEALER:
            self.sock.sndhwm = 0                 # queue as much as we send
            self.sock.rcvhwm = 0
        self.sock.connect(endpoint or _endpoint(tmp_path))

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def request(self, command: str, args: dict | None = None) -> None:
        body = {"command": command, **({"args": args} if args is not None else {})}
        self.send(json.dumps(body).encode())

    def replies(self, n: int, within: float) -> list[dict]:
        """Up to n replies (the last frame of each, decoded), waiting at most
        `within` seconds in all."""
        out, deadline = [], time.monotonic() + within
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000)):
                break
            out.append(json.loads(self.sock.recv_multipart()[-1]))
        return out

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _ask(tmp_path: Path, command: str, args: dict | None = None, timeout: float = 10.0):
    """One request over a fresh DEALER: its reply, or None if none came."""
    with Client(tmp_path) as c:
        c.request(command, args)
        got = c.replies(1, timeout)
    return got[0] if got else None


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _alive_for(proc: subprocess.Popen, seconds: float) -> bool:
    """Whether proc is still running after `seconds` (polled: returns at
    once if it exits)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return proc.poll() is None


# ---- findings ------------------------------------------------------------------------------

def test_concurrent_show_proc_requests_all_get_every_workers_figures(master, tmp_path):
    """FINDING (medium): supervisor._on_channel() takes ONE message per
    wake-up (Channel.recv returns the first of everything read_available()
    pulled from the socket); the others sit in the channel's inbox, which
    select() cannot see, until the worker writes again (its next heartbeat,
    25 s later). Two `show proc` at once: the worker's two StatsReplies
    arrive in one read, the second is left in the inbox past the Asker's
    2 s deadline and that request reports the worker as not answering.
    Same for metrics scrapes concurrent with ctl, show activity, ..."""
    m = master("-w", "1", ready=1)
    worker = children(m.proc.pid)[0]
    # the worker stopped while the requests come: once it runs again it
    # answers them back to back, and the master reads several replies at once
    os.kill(worker, signal.SIGSTOP)
    try:
        with Client(tmp_path) as c:
            for _ in range(20):
                c.request("show proc")
            deadline = time.monotonic() + 0.3     # the master has sent its 20 questions
            while time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(worker, signal.SIGCONT)
            got = c.replies(20, 20)
    finally:
        os.kill(worker, signal.SIGCONT)
    assert len(got) == 20 and all(r["ok"] for r in got), got
    unanswered = [r for r in got if not r["result"]["workers"][0]["stats"]]
    assert not unanswered, f"{len(unanswered)} of 20 concurrent `show proc` said the worker " \
        f"did not answer (it answered all 20 within a second)"
    assert m.proc.poll() is None


def test_a_request_flood_does_not_starve_signals_and_timers(master, tmp_path):
    """FINDING (medium): ControlServer.poll() loops `while EVENTS & POLLIN`
    with no bound, so one client that keeps sending (a DEALER, no need to
    read replies) keeps the master inside poll(): signals (TERM, TTIN...),
    timers (heartbeat checks, hard stops, respawns) and worker channels wait
    until the flood ends. Measured: a TTIN sent 1 s into a 5 s flood was
    handled 20 s later (the backlog of ~2 M queued requests)."""
    m = master("-w", "1", ready=1)
    stop = threading.Event()

    def flood():
        with Client(tmp_path) as c:
            while not stop.is_set():
                for _ in range(500):
                    c.send(b"x")               # each gets an error reply; never read
                try:
                    while c.sock.poll(0):
                        c.sock.recv_multipart()
                except zmq.ZMQError:
                    pass

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    try:
        # the master is busy with the flood: give it a second
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            time.sleep(0.05)
        m.proc.send_signal(signal.SIGTTIN)
        sent = time.monotonic()
        handled = False
        while time.monotonic() - sent < 3.0:
            if "TTIN: 2 workers" in m.text():
                handled = True
                break
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(timeout=30)
    assert handled, "TTIN not handled within 3 s while a client floods the control channel"


def test_a_waiting_master_survives_its_runtime_dir_being_removed(master, tmp_path):
    """FINDING (high): ControlServer.poll() calls _open() every RETRY second
    while another master holds the path (a takeover's new instance). _open()
    turns a bind failure into OSError and nothing catches it in the loop: it
    propagates out of Supervisor._loop() and the master dies (with its whole
    generation of workers). A runtime dir removed meanwhile (systemd removes
    RuntimeDirectory= when the old unit stops, tmp cleaners, an operator)
    makes the bind fail with ENOENT. _open() should re-create the private
    dir (_private_dir) and catch OSError (log, retry later)."""
    # only a takeover's new instance waits (any other master refuses to
    # start: test_control_endpoint_shared.py); the old one stays up for its
    # unready_delay after the new one's TERM, its endpoint live meanwhile
    handoff = str(tmp_path / "handoff.sock")
    a = master("-w", "1", "--handoff-socket", handoff, "--unready-delay", "8", ready=1)
    b = master("-w", "1", "--takeover", handoff, ready=1)
    b.wait_log(r"control: ipc://\S+/control is served by another running master")
    shutil.rmtree(tmp_path / "run")
    assert _alive_for(b.proc, 4.0), "the waiting master died:\n" + b.text()[-3000:]
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(timeout=30) == 0
    wait_for(lambda: (r := _ask(tmp_path, "status", timeout=2)) and r["ok"]
             and r["result"]["pid"] == b.proc.pid, 20,
             lambda: "the second master serving control once the first is gone\n" + b.text())


def test_requests_in_flight_at_an_upgrades_exec_get_an_answer(master, tmp_path):
    """FINDING (medium): `upgrade` runs the exec inside the request loop.
    A deferred reply still owed (a `show proc` waiting on the Asker) and
    the requests queued behind the upgrade in the ROUTER are dropped by
    before_exec()'s close: those clients never get a reply (a REQ client is
    stuck until its own timeout, a DEALER forever). Suggested: before the
    exec, fail every outstanding Responder ("the master re-executed: ask
    again") and drain the ROUTER answering the same."""
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "1", ready=1)
    worker = children(m.proc.pid)[0]
    os.kill(worker, signal.SIGSTOP)              # its answer to `show proc` is late
    try:
        with Client(tmp_path) as c:
            c.request("show proc")
            c.request("upgrade")
            c.request("status")
            got = c.replies(3, 20)
    finally:
        os.kill(worker, signal.SIGCONT)
    assert len(got) == 3, f"only {len(got)} of 3 requests answered: {got}"


def test_two_upgrades_at_once_both_get_a_reply(master, tmp_path):
    """FINDING (medium, same root as above): two `upgrade` requests that
    reach the master together: the first execs, the second (queued in the
    ROUTER) is dropped with the socket and never answered."""
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "1", ready=1)
    with Client(tmp_path) as c:
        c.send(b'{"command": "upgrade"}')
        c.send(b'{"command": "upgrade"}')
        got = c.replies(2, 30)
    assert len(got) == 2, f"only {len(got)} of 2 upgrades answered: {got}"
    assert m.proc.poll() is None


def test_drain_during_a_graceful_stop_does_not_claim_a_replacement(master, tmp_path):
    """FINDING (low): commands/drain.py checks sup.pending but not
    sup.stopping; Supervisor._replace() then returns silently (stopping), yet
    drain replies {"replacing": ...}: the operator is told a replacement is
    starting when nothing happens. During unready_delay the workers are
    still READY, so this path is taken. Suggested: refuse like scale does
    ("the master is stopping"), or have _replace() return whether it
    started one."""
    m = master("-w", "1", "--unready-delay", "8", ready=1)
    m.proc.send_signal(signal.SIGTERM)
    m.wait_log(r"graceful stop: unready; serving on for 8s")
    got = _ask(tmp_path, "drain", {"target": "1.0"})
    assert got is not None
    assert not (got["ok"] and "replacing" in got["result"]), \
        f"drain during a stop claims a replacement that never starts: {got}"


@pytest.mark.parametrize("target", ["\u00b2", "9" * 5000])
def test_drain_with_an_odd_numeric_target_is_a_plain_error(master, tmp_path, target):
    """FINDING (low): commands/drain.py tests `target.isdigit()` then calls
    int(target): "²" is a digit to isdigit() but int() raises ValueError,
    and 5000 digits exceed Python's int-from-str limit (4300). Both end in
    dispatch()'s catch-all: an "internal error: ValueError: ..." reply and
    a traceback in the master's log, for plain bad input. Suggested:
    `target.isascii() and target.isdigit() and len(target) < 8`."""
    m = master("-w", "1", ready=1)
    got = _ask(tmp_path, "drain", {"target": target})
    assert got is not None and not got["ok"]
    assert "internal error" not in got["error"], got["error"][:300]
    assert "Traceback" not in m.text()


def test_ctl_reports_bad_curve_files_without_a_traceback(tmp_path):
    """FINDING (low): master/ctl.py _socket() calls zmq.auth.load_certificate
    on the user's --curve-server-key / --curve-client-cert without catching
    OSError/ValueError: a missing or malformed key file ends `sockherd ctl`
    with a Python traceback instead of a one-line error and exit 2."""
    bad = tmp_path / "nokey"
    done = subprocess.run(
        [sys.executable, "-m", "sockherd.master", "ctl", "--endpoint", "tcp://127.0.0.1:9",
         "--curve-server-key", str(bad), "--curve-client-cert", str(bad), "--timeout", "1",
         "status"], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode in (1, 2) and "nokey" in done.stderr


def test_ctl_reports_a_malformed_endpoint_without_a_traceback(tmp_path):
    """FINDING (low): `sockherd ctl --endpoint foo://x` (or `ipc://` with a
    path too long for sun_path): sock.connect() raises zmq.ZMQError, which
    nothing in ctl.main catches: a traceback instead of a usage error."""
    for endpoint in ("foo://x", "ipc://" + "/x" * 100):
        done = subprocess.run(
            [sys.executable, "-m", "sockherd.master", "ctl", "--endpoint", endpoint,
             "--timeout", "1", "status"], capture_output=True, text=True, timeout=60)
        assert "Traceback" not in done.stderr, (endpoint, done.stderr)
        assert done.returncode in (1, 2, 3), (endpoint, done.returncode)


# ---- guards --------------------------------------------------------------------------------

ODD_FRAMES = [
    [b""],                                            # an empty frame
    [b"", b""],                                       # REQ envelope, empty body
    [b"x"],
    [b"\xff\xfe\x00"],                                # not UTF-8
    [b"null"], [b"[]"], [b"1e999"], [b'"status"'],
    [b'{"command": "status"'],                        # truncated
    [b'{"command": 1}'],
    [b'{"command": "status", "args": []}'],
    [b'{"command": "status", "args": null}'],
    [b'{"command": "status", "extra": 1}'],
    [b'{"command": "status", "args": {"x": 1}}'],
    [b'{"command": "' + b"a" * 60000 + b'"}'],          # long, under MAX_REQUEST
    [b'{"command": "status", "args": {"x": ' + b"[" * 30000 + b"]" * 30000 + b"}}"],
    [b'{"command": "status", "args": {"x": ' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}}"],
    [b'{"command": "show fd", "args": {"worker": "1.0", "fd": ' + b"9" * 5000 + b"}}"],
    [b'{"command": "show fd", "args": {"worker": "1.0", "fd": 1e308}}'],
    [b'{"command": "show fd", "args": {"worker": "1.0", "fd": -2}}'],
    [b'{"command": "show fd", "args": {"worker": "1.0", "fd": 16777217}}'],
    [b'{"command": "show fd", "args": {"worker": "1.0", "fd": true}}'],
    [b'{"command": "show fd", "args": {"worker": "1.0", "fd": "3"}}'],
    [b'{"command": "scale", "args": {"workers": 0}}'],
    [b'{"command": "scale", "args": {"workers": -1}}'],
    [b'{"command": "scale", "args": {"workers": 1e3}}'],
    [b'{"command": "scale", "args": {"workers": 1025}}'],
    [b'{"command": "scale", "args": {"workers": ' + b"1" * 400 + b"}}"],
    [b'{"command": "stop", "args": {"fast": 1}}'],
    [b'{"command": "stop", "args": {"fast": "yes"}}'],
    [b'{"command": "drain", "args": {}}'],
    [b'{"command": "drain", "args": {"target": ""}}'],
    [b'{"command": "drain", "args": {"target": "0"}}'],
    [b'{"command": "drain", "args": {"target": "1048576"}}'],
    [b'{"command": "drain", "args": {"target": "-1"}}'],
    [b'{"command": "drain", "args": {"target": "1.0.0"}}'],
    [b'{"command": "show activity", "args": {"worker": "\\u0000"}}'],
    [b'{"command": "show fd", "args": {"worker": "' + b"\\ud800" + b'"}}'],   # lone surrogate
    [b"a", b"b", b"c", b"{}"],                       # a multi-frame envelope
    [b"", b"", b"", b'{"command": "help"}'],        # refused: one envelope frame at most
    [b"x" * 200000],                                 # over MAX_REQUEST, under MAXMSGSIZE
]


def test_guard_odd_requests_each_get_one_error_reply_and_the_master_answers(master, tmp_path):
    """Each odd frame set, from a DEALER (the last frame is the request):
    exactly one reply that is a typed error (or a valid reply to `help`),
    no traceback to the client or in the log; then `status` works."""
    m = master("-w", "1", ready=1)
    with Client(tmp_path) as c:
        for frames in ODD_FRAMES:
            c.send(*frames)
            got = c.replies(1, 10)
            assert len(got) == 1, (frames[0][:60], "no reply")
            r = got[0]
            if frames[-1] == b'{"command": "help"}' and len(frames) <= 2:
                assert r["ok"], r
                continue
            assert r["ok"] is False and r["error"], (frames[0][:60], r)
            assert "Traceback" not in r["error"] and "internal error" not in r["error"], \
                (frames[0][:60], r["error"][:300])
        assert not c.replies(1, 0.5), "a request answered twice"
    assert _ask(tmp_path, "status")["result"]["pid"] == m.proc.pid
    assert "Traceback" not in m.text()


def test_guard_garbage_frames_never_stop_the_master_answering(master, tmp_path):
    """hypothesis: random multi-frame messages from a DEALER and a raw REQ;
    afterwards `status` answers and the log has no traceback."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    m = master("-w", "1", ready=1)
    json_ish = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner,
                                                                  max_size=4),
        max_leaves=20)
    request_ish = st.fixed_dictionaries(
        {"command": st.sampled_from(["status", "show fd", "drain", "scale", "show activity",
                                     "help", "nope"]) | st.text()},
        optional={"args": json_ish, "x": json_ish}).map(lambda d: json.dumps(d).encode())
    frame = st.binary(max_size=300) | request_ish
    client = Client(tmp_path)
    sent = [0]

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(frame, min_size=1, max_size=5))
    def one(frames):
        # never a `stop`/`reload`/`upgrade`/`scale` that succeeds: keep the master as is
        last = frames[-1]
        try:
            cmd = json.loads(last).get("command")
        except Exception:                         # noqa: BLE001 - not JSON: fine
            cmd = None
        if cmd in ("stop", "reload", "upgrade", "scale", "drain"):
            frames = frames[:-1] + [b'{"command": "status"}']
        client.send(*frames)
        sent[0] += 1
        assert client.replies(1, 10), f"no reply to {frames!r}"

    try:
        one()
    finally:
        client.close()
    assert m.proc.poll() is None
    assert _ask(tmp_path, "status")["result"]["pid"] == m.proc.pid
    assert "Traceback" not in m.text()


def test_guard_req_and_dealer_envelopes_and_a_raw_socket(master, tmp_path):
    """REQ (identity + empty delimiter), DEALER without the delimiter, and a
    raw unix-socket client speaking no ZMTP: the first two are answered, the
    third changes nothing."""
    m = master("-w", "1", ready=1)
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(str(tmp_path / "run" / "control"))
    raw.sendall(b"\xff" * 64 + b"GET / HTTP/1.0\r\n\r\n" * 10)
    try:
        with Client(tmp_path, zmq.REQ) as req:
            req.sock.send(b'{"command": "status"}')
            assert req.sock.poll(10000)
            assert json.loads(req.sock.recv())["result"]["pid"] == m.proc.pid
        assert _ask(tmp_path, "status")["ok"]
    finally:
        raw.close()
    assert _ask(tmp_path, "status")["ok"]


def test_guard_no_fd_or_connection_growth_over_many_clients(master, tmp_path):
    """300 clients that connect, ask, and go (some without reading their
    reply, some before it comes): the master's fd count comes back."""
    m = master("-w", "1", ready=1)
    assert _ask(tmp_path, "status")["ok"]
    before = _fds(m.proc.pid)
    for i in range(300):
        with Client(tmp_path) as c:
            c.request("status" if i % 3 else "show proc")
            if i % 2:
                c.replies(1, 10)
    wait_for(lambda: _fds(m.proc.pid) <= before + 2, 20,
             lambda: f"fds back to {before} (now {_fds(m.proc.pid)})")
    for _ in range(20):
        assert ctl(tmp_path, "status").returncode == 0
    wait_for(lambda: _fds(m.proc.pid) <= before + 2, 20,
             lambda: f"fds back to {before} after ctl (now {_fds(m.proc.pid)})")


def test_guard_two_reloads_at_once_one_serves_one_refused_each_answered_once(master, tmp_path):
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "1", ready=1)
    with Client(tmp_path) as c:
        c.request("reload")
        c.request("reload")
        got = c.replies(2, 60)
        assert not c.replies(1, 1.0), "a third reply"
    assert len(got) == 2, got
    oks = [r for r in got if r["ok"]]
    refused = [r for r in got if not r["ok"]]
    assert len(oks) == 1 and oks[0]["result"]["generation"] == 2, got
    assert len(refused) == 1 and "still starting" in refused[0]["error"], got
    assert ok_json(tmp_path, "status")["generation"] == 2
    assert "Traceback" not in m.text()


def test_guard_a_client_gone_before_its_reload_reply(master, tmp_path):
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "1", ready=1)
    with Client(tmp_path) as c:
        c.request("reload")
        m.wait_log(r"reload: starting generation 2")      # delivered: now go
    m.wait_log(r"reload: generation 2 serving")
    st = ok_json(tmp_path, "status")
    assert st["generation"] == 2 and st["pid"] == m.proc.pid


def test_guard_reload_during_a_stop_is_refused_and_stop_again_is_idempotent(master, tmp_path):
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "1", "--unready-delay", "3", ready=1)
    with Client(tmp_path) as c:
        c.request("stop")
        c.request("reload")
        c.request("scale", {"workers": 3})
        c.request("stop")
        got = c.replies(4, 20)
    assert len(got) == 4, got
    assert got[0] == {"ok": True, "result": {"stopping": True, "fast": False}}
    assert not got[1]["ok"] and "stopping" in got[1]["error"]
    assert not got[2]["ok"] and "stopping" in got[2]["error"]
    assert got[3]["ok"] and got[3]["result"].get("already")
    assert m.proc.wait(timeout=30) == 0


def test_guard_fast_stop_while_a_reload_starts_answers_the_reload(master, tmp_path):
    """A `reload` whose new worker never gets READY (hangapp sleeps) and a
    `stop --fast`: the reload's deferred reply still comes (a refusal)."""
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "1", ready=1)
    shutil.copy(tmp_path / "hangapp.py", tmp_path / "verapp.py")
    with Client(tmp_path) as c:
        c.request("reload")
        m.wait_log(r"reload: starting generation 2")
        c.request("stop", {"fast": True})
        got = c.replies(2, 30)
    assert len(got) == 2, got
    by_ok = sorted(got, key=lambda r: r["ok"])
    assert not by_ok[0]["ok"] and "reload refused" in by_ok[0]["error"], got
    assert by_ok[1]["result"] == {"stopping": True, "fast": True}
    m.proc.wait(timeout=30)


def test_guard_show_fd_odd_fd_numbers(master, tmp_path):
    m = master("-w", "1", ready=1)
    for fd in (0, 2, 100000, 1 << 24):             # not in fdcore's table, or past maxfd
        got = _ask(tmp_path, "show fd", {"worker": "1.0", "fd": fd})
        assert got is not None, fd
        assert (got["ok"] and got["result"]["fds"] == []) or \
            (not got["ok"] and f"fd {fd}" in got["error"]), (fd, got)
    pid = children(m.proc.pid)[0]
    assert _ask(tmp_path, "show fd", {"worker": str(pid)})["ok"]
    assert _ask(tmp_path, "show proc")["result"]["workers"][0]["pid"] == pid


def test_guard_symlinked_runtime_dir_is_refused(master, tmp_path):
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o755)
    link = tmp_path / "linked"
    link.symlink_to(real)
    m = master("-w", "1", "--runtime-dir", str(link), ready=None)
    assert m.proc.wait(timeout=30) != 0
    assert "runtime directory" in m.text() and "Traceback" not in m.text()
    assert not (real / "control").exists()
    assert not children(m.proc.pid)


def test_guard_a_stale_file_at_the_socket_path_is_replaced_0600(master, tmp_path):
    rt = tmp_path / "run"
    rt.mkdir(mode=0o755)
    (rt / "control").write_text("not a socket")
    (rt / "events").write_text("not a socket")
    m = master("-w", "1", ready=1)
    assert _ask(tmp_path, "status")["result"]["pid"] == m.proc.pid
    assert (rt.stat().st_mode & 0o777) == 0o700
    for name in ("control", "events"):
        st = (rt / name).stat()
        assert (st.st_mode & 0o777) == 0o600, name


def _curve_client(endpoint: str, client_secret: str, server_public_file: str) -> Client:
    import zmq.auth

    pub, sec = zmq.auth.load_certificate(client_secret)
    server = zmq.auth.load_certificate(server_public_file)[0]
    return Client(None, endpoint=endpoint, curve=(pub, sec, server))


def test_guard_curve_wrong_server_key_and_handshake_floods(master, tmp_path):
    """A client with the right certificate but the wrong server key, and
    50 unauthorised handshakes: no answer to any, and the authorised
    client is answered right after (the ZAP handler runs in the loop)."""
    m, endpoint, good, impostor, impostor_public = curve_master(master, tmp_path)
    server_public = str(tmp_path / "keys" / "server.key")
    wrong = _curve_client(endpoint, good, impostor_public)
    strangers = [_curve_client(endpoint, impostor, server_public) for _ in range(50)]
    def try_send(c: Client) -> None:
        # a DEALER with no completed handshake has no pipe: send would block
        try:
            c.sock.send(b'{"command": "status"}', zmq.NOBLOCK)
        except zmq.Again:
            pass

    try:
        deadline = time.monotonic() + 2.0           # the handshakes are tried meanwhile
        while time.monotonic() < deadline:
            for c in [wrong, *strangers]:
                try_send(c)
            time.sleep(0.2)
        assert not wrong.replies(1, 2.0)
        assert not any(s.replies(1, 0.02) for s in strangers)
        with _curve_client(endpoint, good, server_public) as ok:
            ok.request("status")
            got = ok.replies(1, 10)
        assert got and got[0]["result"]["pid"] == m.proc.pid
    finally:
        wrong.close()
        for s in strangers:
            s.close()
    assert m.proc.poll() is None and "Traceback" not in m.text()


def test_guard_watch_subscribers_that_never_read_do_not_block_the_loop(master, tmp_path):
    """SUB clients that never read while reloads publish events: the PUB
    drops (never blocks), the master keeps answering."""
    write_app(tmp_path, "v1")
    m = master("verapp:app", "-w", "1", ready=1)
    ctx = zmq.Context()
    subs = []
    try:
        for _ in range(5):
            s = ctx.socket(zmq.SUB)
            s.linger = 0
            s.rcvhwm = 1
            s.setsockopt(zmq.SUBSCRIBE, b"")
            s.connect(f"ipc://{tmp_path / 'run' / 'events'}")
            subs.append(s)
        for gen in (2, 3, 4):
            started = time.monotonic()
            assert ok_json(tmp_path, "reload")["generation"] == gen
            assert time.monotonic() - started < 30
        assert _ask(tmp_path, "status")["result"]["generation"] == 4
    finally:
        for s in subs:
            s.close(0)
        ctx.term()
    assert m.proc.poll() is None
