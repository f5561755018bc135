"""A gunicorn-style Python settings file (`-c FILE.py`) and gunicorn's names
(issue 24 §3): read as its module globals, never reported as bad TOML;
gunicorn's settings as aliases with gunicorn's meaning, the unsupported ones
refused by name, the harmless ones a warning; WEB_CONCURRENCY, PORT and
SOCKHERD_CMD_ARGS; `check --print-config` says where each value came from;
`-p/--pid` writes the master's pid and removes it at exit. Before: a .py
file was "not valid TOML", and every gunicorn name was unknown."""
from __future__ import annotations

import os
import signal
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_run import gone, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(90)

GUNICORN_ENV = ("PORT", "WEB_CONCURRENCY")


def check(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith("SOCKHERD_") and k not in GUNICORN_ENV}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "sockherd.master", "check", *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=30)


def config(r: subprocess.CompletedProcess) -> dict[str, tuple[str, str]]:
    """`--print-config`'s lines: key -> (value as printed, source)."""
    out = {}
    for line in r.stdout.splitlines():
        key, _, rest = line.partition(" = ")
        value, _, source = rest.rpartition("  # ")
        out[key.strip()] = (value, source)
    return out


@pytest.fixture
def appdir(tmp_path: Path) -> Path:
    (tmp_path / "good.py").write_text("def app(environ, start_response):\n"
                                      "    start_response('200 OK', [])\n    return [b'ok']\n")
    return tmp_path


def test_python_file_is_read_as_its_module_globals(appdir):
    cfg = appdir / "gunicorn.conf.py"
    cfg.write_text(
        "import multiprocessing, os\n"
        "wsgi_app = 'good:app'\n"
        "bind = '127.0.0.1:8123'\n"                 # one string: gunicorn's usual bind
        "workers = os.environ.get('NWORK', '3')\n"  # computed, a string: as gunicorn takes it
        "threads = 2\n"
        "timeout_helper = 5\n"                      # the file's own variable: left alone
        "def helper():\n    return 1\n"
        "graceful_timeout = 12\n"
        "keepalive = 4\n"
        "loglevel = 'warning'\n"
        "accesslog = '-'\n"
        "errorlog = '-'\n"
        "worker_class = 'gthread'\n"
        "limit_request_field_size = 4000\n"
        "daemon = False\n"                          # gunicorn's 'off': nothing asked
        "certfile = None\n")
    r = check("-c", str(cfg), "--print-config", cwd=appdir)
    assert r.returncode == 0, r.stderr
    got = config(r)
    src = f"file {cfg}"
    assert got["app"] == ('"good:app"', src)
    assert got["bind"] == ('["127.0.0.1:8123"]', src)
    assert got["workers"] == ("3", src)
    assert got["threads"] == ("2", src)
    assert got["hard_stop_after"] == ("12.0", src)
    assert got["keepalive_timeout"] == ("4.0", src)
    assert got["log_level"] == ('"warning"', src)
    assert got["access_log"] == ("true", src)
    assert got["limit_request_field_size"] == ("4000", src)
    assert got["backlog"] == ("2048", "default")
    # and it imports and validates as `check` does
    r = check("-c", str(cfg), cwd=appdir)
    assert r.returncode == 0 and "app good:app imports" in r.stdout, r.stderr


def test_python_file_errors_name_the_file_never_toml(appdir):
    cfg = appdir / "conf.py"
    cfg.write_text("workers = 2\nraise RuntimeError('no DATABASE_URL')\n")
    r = check("-c", str(cfg), cwd=appdir)
    assert r.returncode == 2
    assert "conf.py: running it raised RuntimeError('no DATABASE_URL') (line 2)" in r.stderr
    assert "TOML" not in r.stderr
    cfg.write_text("workers = \n")
    r = check("-c", str(cfg), cwd=appdir)
    assert r.returncode == 2 and "conf.py: not valid Python" in r.stderr and "TOML" not in r.stderr
    cfg.write_text("workers = 'many'\n")
    r = check("-c", str(cfg), cwd=appdir)
    assert r.returncode == 2 and "conf.py: workers = 'many': expected `int`" in r.stderr


@pytest.mark.parametrize("line,message", [
    ("worker_class = 'gevent'", "worker_class = 'gevent': invalid enum value 'gevent' "
                                "(allowed: sync, gthread)"),
    ("ssl_version = 2", "gunicorn's ssl_version is not supported by sockherd: use "
                        "ssl_min_version"),
    ("daemon = True", "gunicorn's daemon is not supported by sockherd: run it under systemd"),
    ("def ssl_context(conf, default):\n    pass", "gunicorn's ssl_context is not supported"),
])
def test_unsupported_gunicorn_setting_is_refused_by_name(appdir, line, message):
    cfg = appdir / "gunicorn.conf.py"
    cfg.write_text(line + "\n")
    r = check("-c", str(cfg), "good:app", cwd=appdir)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr


def test_gunicorns_log_and_proxy_names_become_ours(appdir):
    cfg = appdir / "gunicorn.conf.py"
    cfg.write_text("accesslog = '/var/log/app/access.log'\nerrorlog = '-'\n"
                   "secure_scheme_headers = {'X-FORWARDED-PROTO': 'https'}\n")
    r = check("-c", str(cfg), "--print-config", "good:app", cwd=appdir)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert re.search(r"access_logfile\s.*/var/log/app/access\.log", out), out
    assert re.search(r"secure_scheme_headers\s.*X-FORWARDED-PROTO=https", out), out


def test_harmless_gunicorn_setting_is_a_warning(appdir):
    cfg = appdir / "gunicorn.conf.py"
    cfg.write_text("preload_app = True\nworker_tmp_dir = '/dev/shm'\n"
                   "def post_fork(server, worker):\n    server.log.info('spawned')\n")
    r = check("-c", str(cfg), "good:app", cwd=appdir)
    assert r.returncode == 0, r.stderr
    assert "warning: " in r.stderr and "gunicorn's preload_app = True is ignored" in r.stderr
    assert "gunicorn's worker_tmp_dir = '/dev/shm' is ignored" in r.stderr
    assert "gunicorn's hook post_fork() is ignored: never called: workers are started with " \
        "exec, not forked (post_worker_init runs in each worker)" in r.stderr


def test_gunicorn_names_in_toml_and_flags(appdir):
    cfg = appdir / "s.toml"
    cfg.write_text("graceful_timeout = 7\nkeepalive = 3\naccesslog = '-'\n")
    r = check("-c", str(cfg), "--print-config", cwd=appdir)
    assert r.returncode == 0, r.stderr
    got = config(r)
    assert got["hard_stop_after"][0] == "7.0" and got["keepalive_timeout"][0] == "3.0"
    assert got["access_log"][0] == "true"
    r = check("--graceful-timeout", "9", "--keep-alive", "2", "-k", "sync", "-p",
              str(appdir / "x.pid"), "--print-config", cwd=appdir)
    got = config(r)
    assert got["hard_stop_after"] == ("9.0", "cli") and got["keepalive_timeout"] == ("2.0", "cli")
    assert got["worker_class"] == ('"sync"', "cli")
    assert got["pidfile"] == (f'"{appdir / "x.pid"}"', "cli")


def test_web_concurrency_port_and_cmd_args(appdir):
    env = {"WEB_CONCURRENCY": "5", "PORT": "8456"}
    got = config(check("--print-config", cwd=appdir, env=env))
    assert got["workers"] == ("5", "env WEB_CONCURRENCY")
    assert got["bind"] == ('["0.0.0.0:8456"]', "env PORT")
    # they change the defaults only: a file, SOCKHERD_* and flags win
    cfg = appdir / "s.toml"
    cfg.write_text("workers = 2\n")
    got = config(check("-c", str(cfg), "--print-config", cwd=appdir, env=env))
    assert got["workers"] == ("2", f"file {cfg}")
    got = config(check("--print-config", cwd=appdir,
                       env={**env, "SOCKHERD_BIND": "127.0.0.1:1"}))
    assert got["bind"] == ('["127.0.0.1:1"]', "env SOCKHERD_BIND")
    # SOCKHERD_CMD_ARGS: flags, over SOCKHERD_* and under the command line
    env = {"SOCKHERD_CMD_ARGS": "-w 6 --threads 3 -b 127.0.0.1:9", "SOCKHERD_WORKERS": "4"}
    got = config(check("--print-config", "--threads", "2", cwd=appdir, env=env))
    assert got["workers"] == ("6", "env SOCKHERD_CMD_ARGS")
    assert got["threads"] == ("2", "cli")
    assert got["bind"] == ('["127.0.0.1:9"]', "env SOCKHERD_CMD_ARGS")
    r = check("--print-config", cwd=appdir, env={"SOCKHERD_CMD_ARGS": "--no-such 1"})
    assert r.returncode == 2 and "SOCKHERD_CMD_ARGS = '--no-such 1': unknown flag(s) --no-such" \
        in r.stderr
    r = check("--print-config", cwd=appdir, env={"WEB_CONCURRENCY": "lots"})
    assert r.returncode == 2 and "WEB_CONCURRENCY = 'lots'" in r.stderr


def test_pidfile_written_at_start_and_removed_at_exit(master, tmp_path):
    pid = tmp_path / "run" / "sockherd.pid"
    pid.parent.mkdir(exist_ok=True)
    m = master("wsgiapp:app", "-w", "1", "-p", str(pid), ready=1)
    assert pid.read_text() == f"{m.proc.pid}\n"
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=30) == 0
    assert not pid.exists()
    # one that cannot be written refuses the start, naming it
    bad = tmp_path / "nodir" / "x.pid"
    m = master("wsgiapp:app", "-w", "1", "--pid", str(bad), ready=None)
    assert m.proc.wait(timeout=30) == 1
    assert f"pidfile {bad}: cannot write it" in m.text()
