"""`sockherd check`, run as a real process: settings and app import are
validated without serving; exit 0 / 2 (bad setting) / 1 (app import)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)


def check(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SOCKHERD_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "sockherd.master", "check", *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=30)


@pytest.fixture
def appdir(tmp_path: Path) -> Path:
    (tmp_path / "good.py").write_text("def app(environ, start_response):\n    return [b'ok']\n"
                                      "class Handlers:\n    handler = staticmethod(app)\n"
                                      "notcallable = 42\n")
    (tmp_path / "broken.py").write_text("import json\nraise RuntimeError('db not configured')\n")
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    return tmp_path


def test_good_app_and_settings(appdir):
    r = check("good:app", "-w", "3", "--threads", "4", "--thread-groups", "2", "-b", "127.0.0.1:0",
              cwd=appdir)
    assert r.returncode == 0, r.stderr
    assert "app good:app imports;" in r.stdout
    assert "interface: wsgi (a plain callable of two arguments)" in r.stdout
    assert "3 workers x 4 threads in 2 groups; bind 127.0.0.1:0" in r.stdout
    r = check("good:Handlers.handler", cwd=appdir)
    assert r.returncode == 0, r.stderr


def test_chdir_and_pythonpath(appdir, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    assert check("good:app", "--chdir", str(appdir), cwd=elsewhere).returncode == 0
    assert check("good:app", "--pythonpath", str(appdir), cwd=elsewhere).returncode == 0
    r = check("good:app", "--chdir", str(appdir / "missing"), cwd=elsewhere)
    assert r.returncode == 1 and "cannot change to" in r.stderr


@pytest.mark.parametrize("spec,message", [
    ("nosuch:app", "app 'nosuch:app': no module named 'nosuch'"),
    ("good:nothing", "app 'good:nothing': 'good' has no attribute path 'nothing'"),
    ("good:notcallable", "app 'good:notcallable': int object is not callable"),
    ("broken:app", "app 'broken:app': importing 'broken' failed: RuntimeError('db not configured')"),
    ("exits:app", "importing 'exits' failed: SystemExit(3)"),
])
def test_app_that_does_not_import(appdir, spec, message):
    r = check(spec, cwd=appdir)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert message in r.stderr
    if spec == "broken:app":               # its author needs the traceback
        assert "Traceback" in r.stderr and 'broken.py", line 2' in r.stderr


@pytest.mark.parametrize("args,env,message", [
    (("-w", "-3"), {}, "bad setting: command line: -w = '-3': expected `int` >= 0"),
    ((), {"SOCKHERD_BACKLOG": "huge"}, "environment: SOCKHERD_BACKLOG = 'huge'"),
    (("-b", "127.0.0.1:99999"), {}, "bind: '127.0.0.1:99999': port '99999'"),
    (("--interface", "http"), {}, "--interface = 'http': invalid enum value"),
    (("bad spec",), {}, "MODULE:CALLABLE = 'bad spec'"),
])
def test_bad_setting_exits_2(appdir, args, env, message):
    r = check(*args, cwd=appdir, env=env)
    assert r.returncode == 2 and message in r.stderr, (r.stdout, r.stderr)
    assert r.stdout == ""


def test_settings_file(appdir):
    cfg = appdir / "sockherd.toml"
    cfg.write_text('app = "good:app"\nworkers = 2\n')
    r = check("-c", str(cfg), cwd=appdir)
    assert r.returncode == 0 and "2 workers" in r.stdout, r.stderr
    r = check(cwd=appdir, env={"SOCKHERD_CONFIG": str(cfg), "SOCKHERD_WORKERS": "5"})
    assert r.returncode == 0 and "5 workers" in r.stdout, r.stderr
    cfg.write_text("workers = 'two'\n")
    r = check("-c", str(cfg), cwd=appdir)
    assert r.returncode == 2 and "sockherd.toml: workers = 'two'" in r.stderr
