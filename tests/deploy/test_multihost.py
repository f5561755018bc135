"""The multi-host proof (tracker issue 11 section 2), small: bench/multihost.py's
three network namespaces (two sockherd hosts, HAProxy health-checking
/-/ready), one roll of a new version across both hosts per mode (ctl reload,
ctl upgrade, TERM with unready_delay + a fresh start) under continuous load,
and not one failed request. Root only; skipped with the reason when `ip
netns`, haproxy or gcc is missing or 10.251.7.0/24 is in use here.

Everything (namespaces, veth pairs, bridge, processes, temporary files) is
removed by the fixture whatever happens; the main test checks nothing is
left. A file lock (multihost.LOCK_PATH) keeps runs apart (pytest -n, the
benchmark): the tests wait for it up to 120 s, then skip."""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "bench")
sys.path.insert(0, BENCH)
import multihost as M  # noqa: E402

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(M.missing() is not None,
                                 reason=f"multihost: {M.missing()}")]


def small_args(**over) -> argparse.Namespace:
    a = M.parse_args(["--rounds", "1", "--close-conns", "4", "--ka-conns", "4",
                      "--warmup", "0.5", "--gap", "0.2", "--settle", "1.2"])
    for k, v in over.items():
        setattr(a, k, v)
    return a


def leftovers() -> list[str]:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    out = [ln.split()[0] for ln in ns.splitlines() if ln.startswith(M.PREFIX + "-")]
    out += [ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines()
            if ln.split(":")[1].strip().startswith(M.PREFIX + "-")]
    return out


@contextlib.contextmanager
def exclusive():
    """multihost's lock, or a skip saying who holds it."""
    try:
        cm = M.exclusive(120)
        cm.__enter__()
    except M.Busy as e:
        pytest.skip(f"multihost: {e}")
    try:
        yield
    finally:
        cm.__exit__(None, None, None)


@pytest.fixture
def run():
    """The network, the two hosts serving v1 and HAProxy (`--lb retry`) with
    both servers UP; everything removed afterwards whatever happened."""
    logs: list[str] = []
    r = M.Run(small_args(), log=logs.append, lock_wait=120)
    try:
        try:
            r.setup()
        except M.SetupError as e:
            pytest.skip(f"multihost: {e}")
        r.start_lb("retry")
        yield r
    finally:
        r.close()


@pytest.mark.long                          # 46 s in a loaded run: scheduled first
def test_rolling_versions_across_hosts_lose_no_request(run):
    rows = [run.run_mode(mode) for mode in M.MODES]
    final = run.final_check()
    bad_logs = [ln for h in run.hosts for ln in h.log_bad()]
    summary = "\n" + M.report(rows, final, run.a)
    for r in rows:
        assert r["rolls"] == len(M.HOSTS) and r["incomplete"] == 0, summary
        assert r["ok"] > 1000, summary                      # the load really ran
        assert r["failures"] == 0, summary                  # by kind in the summary
        assert r["long_bad"] == 0 and r["ok_long"] >= 1, summary
        # every host answered the round's version on every worker after its roll
        assert all(s["verify"]["ok"] for s in r["steps"]), summary
    restart = rows[2]
    for s in restart["steps"]:
        # lame duck: HAProxy took the host out (/-/ready 503) before its
        # unready_delay ran out, i.e. before its listeners were closed
        assert s["down_s"] < M.UNREADY_DELAY, summary
        assert s["exit_status"] == 0, summary
        assert s["exit_s"] >= M.UNREADY_DELAY, summary
    assert final["ok"], summary + f"\n{final.get('why')}"  # last version everywhere
    assert final["lb_hosts"] == ["h1", "h2"], summary
    # send-proxy-v2 to --proxy-protocol v2: the app saw the client, not HAProxy
    assert final["client_peers"] == [M.CLIENT_IP], summary
    assert bad_logs == [], summary
    # the clean-up (the fixture's too, idempotent): nothing of ours left
    procs = list(run.procs.procs)
    run.close()
    assert all(p.poll() is not None for p in procs)
    with exclusive():
        assert leftovers() == []


def test_leftovers_of_a_crashed_run_are_removed():
    """A namespace with a process still in it, a veth and a bridge, as a
    killed run leaves them: cleanup_net() (what every run does first) removes
    them all."""
    ns = M.HOSTS[0]["ns"]
    with exclusive(), contextlib.ExitStack() as stack:
        stack.callback(M.cleanup_net)
        M.cleanup_net()
        M.sh("ip", "netns", "add", ns)
        M.sh("ip", "link", "add", M.BRIDGE, "type", "bridge")
        M.sh("ip", "link", "add", f"{M.PREFIX}-x0", "type", "veth", "peer", "name",
             f"{M.PREFIX}-x1")
        sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "60"],
                                   start_new_session=True)
        stack.callback(lambda: sleeper.poll() is None and (sleeper.kill(), sleeper.wait(10)))
        deadline = time.monotonic() + 10
        while not M.sh("ip", "netns", "pids", ns, check=False).stdout.split():
            assert time.monotonic() < deadline, "the sleeper never entered the namespace"
            time.sleep(0.02)
        removed = M.cleanup_net()
        assert f"netns {ns}" in removed and f"link {M.BRIDGE}" in removed
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert leftovers() == []