"""The metrics across a reload and an upgrade, from a real master: the
`metrics` setting is read again at a reload (the listener moves, goes or
comes), and the counters the master keeps (reloads ok and failed, worker
restarts) carry across an upgrade's re-exec. Every wait polls with a
deadline; every process is reaped by the `master` fixture."""
from __future__ import annotations

import signal
import socket
import urllib.error
from pathlib import Path

import pytest

from test_metrics import crash, per_worker, request, scrape, value, write_app
from test_reload import free_port
from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return True
    except ConnectionRefusedError:
        return False


def scraped(port: int):
    try:
        return scrape(port)
    except (OSError, urllib.error.URLError):
        return None


def test_the_metrics_setting_is_read_again_at_a_reload(master, tmp_path: Path):
    """Issue 18 §5: `metrics` was not re-read on reload: a new address in
    the settings file was ignored until a restart (and one removed kept
    listening). Now it moves with the generation that commits, and the
    restart count moves with it."""
    write_app(tmp_path, "v1")
    first, second = free_port(), free_port()
    config = tmp_path / "sockherd.toml"
    config.write_text(f'metrics = "127.0.0.1:{first}"\n')
    m = master("metricsapp:app", "-w", "2", "-c", str(config))
    m.wait_log(rf"metrics on http://127\.0\.0\.1:{first}/metrics")
    crash(m, first, "1.0", within=30)

    config.write_text(f'metrics = "127.0.0.1:{second}"\n')
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: generation 2 serving")
    fams = wait_for(lambda: scraped(second), 30, lambda: f"metrics on {second}\n{m.text()}")
    assert value(fams, "sockherd_master_generation") == 2
    assert value(fams, "sockherd_worker_restarts_total") == 1
    wait_for(lambda: not listening(first), 30, f"the old metrics address {first} closed")

    config.write_text("")                                # no metrics any more
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: generation 3 serving")
    wait_for(lambda: not listening(second), 30, f"metrics on {second} closed")
    config.write_text(f'metrics = "127.0.0.1:{first}"\n')  # and back
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: generation 4 serving")
    fams = wait_for(lambda: scraped(first), 30, lambda: f"metrics on {first}\n{m.text()}")
    assert value(fams, "sockherd_worker_restarts_total") == 1
    assert request(m.port, "/")[0] == 200


@pytest.mark.long                          # 45 s in a loaded run: scheduled first
def test_an_upgrade_carries_the_masters_counters(master, tmp_path: Path):
    """Issue 18 §5: the counters reset at an upgrade (the new image began
    at 0 reloads ok, 0 failed, 0 restarts: a Prometheus counter going down,
    and `ctl upgrade`, which compares reloads_failed before and after, could
    miss the new image's failed reload). The upgrade's own reload is refused
    here (the app broken meanwhile), so the adopted workers serve on and
    their request counts show too."""
    write_app(tmp_path, "v1")
    mport = free_port()
    m = master("metricsapp:app", "-w", "2", "--metrics", f"127.0.0.1:{mport}")
    m.wait_log(rf"metrics on http://127\.0\.0\.1:{mport}/metrics")
    write_app(tmp_path, "v2")
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload: generation 2 serving")
    (tmp_path / "metricsapp.py").write_text("raise RuntimeError('broken on purpose')\n")
    m.proc.send_signal(signal.SIGHUP)
    m.wait_log(r"reload refused \(generation 3\)")
    write_app(tmp_path, "v3")
    crash(m, mport, "2.0", within=30)
    for _ in range(12):
        assert request(m.port, "/")[0] == 200
    before = wait_for(lambda: (f := scrape(mport))
                      and value(f, "sockherd_worker_requests_total") == 12 and f,
                      30, "12 requests counted")
    assert value(before, "sockherd_reloads_ok_total") == 1
    assert value(before, "sockherd_reloads_failed_total") == 1
    assert value(before, "sockherd_worker_restarts_total", outcome="crashed") == 1

    (tmp_path / "metricsapp.py").write_text("raise RuntimeError('broken on purpose')\n")
    m.proc.send_signal(signal.SIGUSR2)
    m.wait_log(r"upgrade: adopted")
    m.wait_log(r"reload refused \(generation 3\)", count=2)     # the new image's
    after = wait_for(lambda: scraped(mport), 30, "metrics from the new image")
    assert value(after, "sockherd_reloads_ok_total") == 1
    assert value(after, "sockherd_reloads_failed_total") == 2
    assert value(after, "sockherd_worker_restarts_total", outcome="crashed") == 1
    assert per_worker(after, "sockherd_worker_requests_total") == \
        per_worker(before, "sockherd_worker_requests_total")
    # and they go on from there: a worker the new image respawns...
    write_app(tmp_path, "v3")
    crash(m, mport, "2.1", restarts=2, within=30)
    for pid in children(m.proc.pid):          # ... never sees the carried counters
        with open(f"/proc/{pid}/environ", "rb") as f:
            assert b"SOCKHERD_UPGRADE_COUNTERS" not in f.read()


def test_carried_counters_are_read_once_and_taken_out_of_the_environment():
    """The counters' variable never reaches a worker, and a bad one starts
    the new image from 0 instead of failing it."""
    from sockherd.master.upgrade import COUNTERS_VAR, carried_counters

    env = {COUNTERS_VAR: '{"reloads_ok": 3, "restarts": {"crashed": 1}}', "PATH": "/bin"}
    assert carried_counters(env) == {"reloads_ok": 3, "restarts": {"crashed": 1}}
    assert env == {"PATH": "/bin"}
    assert carried_counters(env) == {}
    assert carried_counters({COUNTERS_VAR: "{not json"}) == {}
    assert carried_counters({COUNTERS_VAR: "[1, 2]"}) == {}
