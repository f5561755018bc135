"""Settings tried as a new user would (issue 24 §3, "friendlier settings"):
a list setting given one string in TOML is that one item; an unknown key
suggests the nearest known one; an enum error lists the allowed values;
`run`'s errors print `sockherd run`'s usage; an app factory
(`pkg:create_app()`, gunicorn's; `--factory`, uvicorn's) is served. Before:
`bind = "127.0.0.1:8000"` was "expected `array`", `wrokers` listed every key
without a hint, `--interface http` said "invalid enum value" only, `run
--bogus` printed the top-level usage, and `app:create_app()` was no valid
app."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from test_python_config import check, config
from test_run import http_get as get, master  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(90)

FACTORY_APP = """
def create_app(greeting="hello"):
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [greeting.encode()]
    return app
"""





def test_one_string_for_a_list_setting_is_one_item(tmp_path: Path):
    cfg = tmp_path / "s.toml"
    cfg.write_text('bind = "127.0.0.1:8001"\npythonpath = "lib"\n')
    r = check("-c", str(cfg), "--print-config", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = config(r)
    assert got["bind"][0] == '["127.0.0.1:8001"]' and got["pythonpath"][0] == '["lib"]'


@pytest.mark.parametrize("text,hint", [
    ("wrokers = 2", "unknown setting 'wrokers'; did you mean 'workers'?"),
    ("keepalive_timout = 2", "unknown setting 'keepalive_timout'; did you mean 'keepalive_timeout'?"),
    ("graceful_timout = 2", "did you mean 'graceful_timeout'?"),
    ("zzz = 1", "unknown setting 'zzz' (known: app,"),
])
def test_unknown_key_suggests_the_nearest(tmp_path: Path, text, hint):
    cfg = tmp_path / "s.toml"
    cfg.write_text(text + "\n")
    r = check("-c", str(cfg), cwd=tmp_path)
    assert r.returncode == 2 and hint in r.stderr, r.stderr


def test_enum_error_lists_the_allowed_values(tmp_path: Path):
    r = check("--interface", "http", cwd=tmp_path)
    assert r.returncode == 2
    assert "--interface = 'http': invalid enum value 'http' (allowed: auto, asgi, wsgi, stream)" \
        in r.stderr
    r = check(cwd=tmp_path, env={"SOCKHERD_LOG_LEVEL": "loud"})
    assert "(allowed: debug, info, warning, error)" in r.stderr


def test_run_errors_are_one_line_naming_run(tmp_path: Path):
    """Said for `sockherd run` (not the top level), in one line: the usage
    of run's ~50 lines buried the error (issue 36 §5)."""
    r = subprocess.run([sys.executable, "-m", "sockherd.master", "run", "--bogus"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr == ("sockherd run: unrecognized arguments: --bogus (`sockherd run --help` "
                        "lists the flags)\n"), r.stderr
    r = subprocess.run([sys.executable, "-m", "sockherd.master", "run", "-w"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.startswith("sockherd run: argument -w/--workers: "), \
        r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr


@pytest.mark.parametrize("spec,flags,body", [
    ("factoryapp:create_app()", (), b"hello"),
    ("factoryapp:create_app('bonjour')", (), b"bonjour"),
    ("factoryapp:create_app", ("--factory",), b"hello"),
])
def test_app_factory_is_served(master, tmp_path: Path, spec, flags, body):
    (tmp_path / "factoryapp.py").write_text(FACTORY_APP)
    m = master(spec, *flags, "-w", "1", ready=1)
    assert get(m.port).endswith(b"\r\n\r\n" + body)


def test_app_factory_errors(tmp_path: Path):
    (tmp_path / "factoryapp.py").write_text(FACTORY_APP + "\nnot_a_factory = 3\n"
                                            "def broken():\n    raise KeyError('SECRET')\n")
    r = check("factoryapp:broken()", cwd=tmp_path)
    assert r.returncode == 1 and "calling the factory failed: KeyError('SECRET')" in r.stderr
    r = check("factoryapp:create_app(os.environ)", cwd=tmp_path)
    assert r.returncode == 1 and "the factory's arguments must be Python literals" in r.stderr
    r = check("factoryapp:not_a_factory", "--factory", cwd=tmp_path)
    assert r.returncode == 1 and "the factory is a int, not callable" in r.stderr
