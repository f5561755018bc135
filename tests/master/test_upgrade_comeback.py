"""An upgrade to an image that fails after the exec comes back to the
previous image (issue 19, finding 8: the pre-exec check passed, the new
image exited during its start-up, the workers drained, "the master is
gone", and the listeners closed: 226 ok, 555 refused in 8 s).

The "new image" is the same sockherd run by an interpreter wrapper (the
`python` setting, as the other upgrade tests do) that adds a
sitecustomize to the path: it breaks one function or one module of
sockherd, chosen by a plan file, as a newer sockherd with a bug would be
broken. The wrapper leaves the pre-exec check alone unless told to (the
bug is one the check cannot see), so the failure happens after the exec.
Every wait polls with a deadline; every process is reaped by the `master`
fixture (the pid is the same across the exec and the way back).
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from test_control import ctl, ok_json
from test_reload import Clients, answers, free_port, get, write_app
from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(180)

SITECUSTOMIZE = '''
import importlib.abc, importlib.machinery, json, os, sys

_plan = json.load(open(os.environ["NEWIMAGE_PLAN"]))
if _plan.get("only_when") and _plan["only_when"] not in os.environ:
    _plan["module"] = None


def _fail(*args, **kwargs):
    if _plan["how"] == "exit":
        sys.exit(_plan.get("status", 1))
    if _plan["how"] == "os_exit":
        os._exit(1)
    if _plan["how"] == "oserror":
        raise OSError("the new image cannot bind its control endpoint")
    if _plan["how"] == "settings":
        from sockherd.master.settings import SettingsError
        raise SettingsError("bind_backlog: refused by the new image")
    raise RuntimeError("the new image is broken: " + _plan["attr"])


class _Breaking(importlib.abc.Loader):
    def __init__(self, real):
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        self.real.exec_module(module)
        owner, *path = [module, *_plan["attr"].split(".")]
        for part in path[:-1]:
            owner = getattr(owner, part)
        setattr(owner, path[-1], _fail)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _plan["module"]:
            return None
        if _plan["how"] == "import":
            raise ImportError("the new image's " + name + " does not import")
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = _Breaking(spec.loader)
        return spec


sys.meta_path.insert(0, _Finder())
'''


def breaking_site(tmp_path: Path, name: str, **plan) -> tuple[Path, Path]:
    """A directory holding the sitecustomize, and its plan: break
    plan["module"] (how: "import" fails its import; "raise", "exit",
    "os_exit", "oserror" or "settings" replace plan["attr"] with a function
    that raises RuntimeError, exits 1 (sys.exit, os._exit), raises OSError
    or refuses the settings); with
    only_when, only in a process whose environment has that variable."""
    site = tmp_path / name
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"how": "raise", "attr": "", **plan}))
    return site, path


def new_image(tmp_path: Path, module: str, attr: str = "", how: str = "raise",
              preflight_too: bool = False) -> Path:
    """An interpreter wrapper whose sockherd is broken (breaking_site)."""
    site, plan = breaking_site(tmp_path, "newimage", module=module, attr=attr, how=how)
    wrapper = tmp_path / "newpython"
    skip = "" if preflight_too else (
        'if [ "$2" = sockherd.master.upgrade ]; then exec ' + sys.executable + ' "$@"; fi\n')
    wrapper.write_text(f"#!/bin/sh\n{skip}export PYTHONPATH={site} NEWIMAGE_PLAN={plan}\n"
                       f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def refused(clients: Clients) -> int:
    return sum("ConnectionRefused" in f for f in clients.failures)


BREAKAGES = {
    # a later module does not import (the cli imports the supervisor after
    # it took the re-exec state: the listeners are wrapped already)
    "import-error": dict(module="sockherd.master.supervisor", how="import"),
    # an exception once the supervisor runs: adopting the workers fails
    "exception-in-adoption": dict(module="sockherd.master.generations",
                                  attr="Generations.adopt"),
    # the new image exits (sys.exit) while attaching its control server
    "exit-at-control": dict(module="sockherd.master.control", attr="attach", how="exit"),
    # an exception escaping the loop's first turn, the upgrade's reload
    # still starting (the new generation's workers are handed back too)
    "exception-in-the-loop": dict(module="sockherd.master.handoff", attr="Handoff.sync"),
    # os._exit (no exception: the guard wraps it while on probation)
    "os-exit-in-adoption": dict(module="sockherd.master.generations", attr="Generations.adopt",
                                how="os_exit"),
    # its control endpoint cannot be bound (the cli closes the listeners
    # on that error: it goes back before)
    "control-bind-fails": dict(module="sockherd.master.control", attr="attach", how="oserror"),
    # a setting the new image refuses, met before it took the state (settings
    # are read through traced() since the gunicorn-config work: `run` and
    # the upgrade's pre-check both call it)
    "bad-setting": dict(module="sockherd.master.settings", attr="traced", how="settings"),
}


@pytest.mark.long                  # two upgrades each, 20-70 s in a loaded run: scheduled first
@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_an_upgrade_that_fails_after_the_exec_comes_back_under_load(master, tmp_path,
                                                                     breakage):
    """Finding 8: the pid survives, no connection is refused, the upgrade
    is reported failed with why (log, `ctl upgrade`, status, metrics), the
    previous image's workers serve on, and a later good upgrade works."""
    write_app(tmp_path, "v1")
    config = tmp_path / "sockherd.toml"
    config.write_text("")
    mport = free_port()
    m = master("verapp:app", "-w", "2", "-c", str(config), "--metrics", f"127.0.0.1:{mport}")
    workers = set(children(m.proc.pid))
    config.write_text(f'python = "{new_image(tmp_path, **BREAKAGES[breakage])}"\n')
    write_app(tmp_path, "v2")
    clients = Clients(m.port)
    try:
        wait_for(lambda: clients.ok > 20, 10, "traffic")
        done = ctl(tmp_path, "upgrade", timeout=120, extra=("--timeout", "60"))
        assert done.returncode == 1, (done.stdout, done.stderr, m.text()[-3000:],
                                      f"{clients.ok} ok, {refused(clients)} refused")
        assert "upgrade failed" in done.stderr and "after the exec" in done.stderr, done.stderr
        m.wait_log(r"upgrade failed after the exec: .*: re-executing the previous image")
        m.wait_log(r"upgrade: came back: adopted 1 listener\(s\) and \d+ worker\(s\)")
        # the workers the new image started for its reload, if any, drain
        wait_for(lambda: set(children(m.proc.pid)) == workers, 30, "the previous workers alone")
        before, seen = clients.ok, len(clients.versions)
        wait_for(lambda: clients.ok > before + 20, 20, "traffic after the way back")
    finally:
        clients.stop()
    print(f"{breakage}: {clients.ok} ok, {refused(clients)} refused, "
          f"{len(clients.failures)} failed")
    assert m.proc.poll() is None, m.text()[-3000:]
    assert clients.failures == [], clients.failures[:5]
    assert set(children(m.proc.pid)) == workers          # the same workers serve on
    assert set(clients.versions[seen:]) == {"v1"}
    st = ok_json(tmp_path, "status")
    assert st["pid"] == m.proc.pid and st["generation"] == 1 and st["upgrades_failed"] == 1
    assert "after the exec" in st["last_upgrade_failure"]
    from test_metrics import scrape, value
    assert value(scrape(mport), "sockherd_upgrades_failed_total") == 1
    assert "SOCKHERD_PREVIOUS_IMAGE" not in m.text()     # (never shown whole)

    # a later good upgrade still works, and its image has nothing of the bad one
    config.write_text("")
    done = ctl(tmp_path, "upgrade", timeout=120)
    assert done.returncode == 0, (done.stdout, done.stderr, m.text()[-3000:])
    answers(m.port, "v2")
    for pid in children(m.proc.pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue                                     # an old worker, drained meanwhile
        assert b"NEWIMAGE_PLAN" not in env and b"SOCKHERD_UPGRADE" not in env
        assert b"SOCKHERD_PREVIOUS_IMAGE" not in env


@pytest.mark.parametrize("breakage, said", [
    # the check imported the cli alone; the supervisor, imported later by
    # the cli, was first imported after the exec
    (dict(module="sockherd.master.supervisor", how="import"),
     r"cannot import sockherd: .*sockherd\.master\.supervisor does not import"),
    # the check never read the settings: a new image that refuses them
    # exited at its start, after the exec
    (dict(module="sockherd.master.settings", attr="traced", how="settings"),
     r"refuses the current settings: bind_backlog: refused by the new image"),
], ids=["a-later-module", "the-settings"])
def test_the_precheck_imports_the_whole_master_and_validates_the_settings(master, tmp_path,
                                                                          breakage, said):
    """Finding 8: the pre-exec check passed images that then failed after
    the exec. Now they are refused before it, in the new image's words,
    and this master carries on."""
    write_app(tmp_path, "v1")
    config = tmp_path / "sockherd.toml"
    config.write_text("")
    m = master("verapp:app", "-w", "1", "-c", str(config), ready=1)
    config.write_text(f'python = "{new_image(tmp_path, **breakage, preflight_too=True)}"\n')
    m.proc.send_signal(signal.SIGUSR2)
    m.wait_log(r"upgrade failed: \S+newpython " + said + "; this master carries on")
    assert "re-executing" not in m.text()
    assert get(m.port).startswith("v1 ")


def test_a_previous_image_that_fails_too_is_not_bounced_back_again(master, tmp_path,
                                                                    monkeypatch):
    """The loop guard: the image the way back starts has no previous image
    of its own and carries a bounce count; when it fails as well (its
    sitecustomize breaks it when it is started to come back), it ends like
    any failed start instead of bouncing between the two images."""
    write_app(tmp_path, "v1")
    config = tmp_path / "sockherd.toml"
    config.write_text("")
    # the previous image itself: sound, except when it is started to come back
    site, plan = breaking_site(tmp_path, "previmage", module="sockherd.master.generations",
                               attr="Generations.adopt", only_when="SOCKHERD_UPGRADE_ROLLBACK")
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("NEWIMAGE_PLAN", str(plan))
    m = master("verapp:app", "-w", "1", "-c", str(config), ready=1)
    config.write_text(f'python = "{new_image(tmp_path, "sockherd.master.generations", "Generations.adopt")}"\n')
    m.proc.send_signal(signal.SIGUSR2)
    m.proc.wait(timeout=60)
    text = m.text()
    assert text.count("re-executing the previous image") == 1, text[-3000:]
    assert "the previous image failed too" in text and "nothing left to go back to" in text


# ---- the guard's decisions, without a process ------------------------------------------------------

def test_the_way_back_is_taken_once_and_only_after_an_upgrade(monkeypatch):
    """A fresh start is never on probation; an upgrade's new image is, with
    its previous image; the image the way back started is not sent back
    again (the bounce count), whatever record it holds."""
    from sockherd.master import comeback as cb

    env = {"PATH": "/bin"}
    cb.arm(env)
    assert cb.way_back(cb._probation) == (None, "no upgrade under way")
    assert cb.came_back() is None

    previous = {"executable": "/old/python", "argv": ["run", "app:app"], "cwd": "/",
                "env": {"PYTHONPATH": "/old"}}
    env = {cb.STATE_VAR: "{}", cb.COUNTERS_VAR: "{}", cb.PREVIOUS_VAR: json.dumps(previous)}
    cb.arm(env)
    assert cb.PREVIOUS_VAR not in env                     # no worker of it sees the record
    assert cb.way_back(cb._probation) == (previous, "")

    env = {cb.STATE_VAR: "{}", cb.PREVIOUS_VAR: json.dumps(previous),
           cb.ROLLBACK_VAR: json.dumps({"why": "boom", "bounces": 1})}
    cb.arm(env)
    assert env == {cb.STATE_VAR: "{}"}
    assert cb.came_back() == {"why": "boom", "bounces": 1}
    assert cb.way_back(cb._probation) == (None, "the previous image failed too after "
                                                "coming back")
    cb.serving()
    assert cb._probation is None
    cb.fall_back("no longer on probation")                # returns: nothing to do

    cb.arm({cb.STATE_VAR: "{}", cb.PREVIOUS_VAR: "{not json"})
    assert cb.way_back(cb._probation) == (None, "no previous image was recorded")
    assert os._exit is not cb._real_exit                  # wrapped while on probation
    cb.arm({})
    assert os._exit is cb._real_exit


def test_the_record_of_an_image_fits_in_one_environment_string(monkeypatch):
    """An environment too large for one execve string (128 KiB) is cut to
    the variables that choose the interpreter and its paths."""
    from sockherd.master import comeback as cb

    monkeypatch.setenv("PYTHONPATH", "/old/site")
    monkeypatch.setenv("HUGE", "x" * 200_000)
    monkeypatch.setenv(cb.STATE_VAR, "not recorded")
    rec = json.loads(cb.record())
    assert len(cb.record()) < cb.RECORD_LIMIT
    assert rec["env"]["PYTHONPATH"] == "/old/site" and "HUGE" not in rec["env"]
    assert cb.STATE_VAR not in rec["env"] and rec["executable"] == sys.executable
    monkeypatch.delenv("HUGE")
    assert json.loads(cb.record())["env"]["PATH"]


def test_why_a_start_up_failed_in_one_line():
    from sockherd.master.comeback import why_of

    assert why_of(SystemExit(2)) == "exited with status 2"
    assert why_of(SystemExit("sockherd: bad")) == "exited: sockherd: bad"
    assert why_of(ImportError("no module x")) == "ImportError: no module x"
