"""gunicorn's `logconfig_dict` and a `log_config` table (issue 36 §5): the
dictConfig table in the settings file itself routes the master's and the
workers' lines as a dictConfig file does; what cannot reach a worker as
data (a live stream, a class) is refused naming where it is and how to
spell it; gunicorn's own loggers in it get a warning (nothing logs to
them here). Before: "gunicorn's logconfig_dict is not supported"."""
from __future__ import annotations

import signal
import urllib.request

import pytest

from test_python_config import check
from test_reload import free_port
from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(90)

APP = """
import logging

def app(environ, start_response):
    logging.getLogger("app.views").warning("served %s", environ["PATH_INFO"])
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello"]
"""


def _conf(routed, port) -> str:
    return f"""
import sys
bind = "127.0.0.1:{port}"
logconfig_dict = {{
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {{"bare": {{"format": "ROUTED|%(name)s|%(levelname)s|%(message)s"}}}},
    "handlers": {{"file": {{"class": "logging.FileHandler", "filename": {str(routed)!r},
                          "formatter": "bare"}}}},
    "root": {{"handlers": ["file"], "level": "INFO"}},
    "loggers": {{"gunicorn.error": {{"level": "INFO", "propagate": True}}}},
}}
logconfig_json = "/nonexistent/ignored.json"
"""


def test_a_gunicorn_logconfig_dict_routes_the_master_and_the_workers(master, tmp_path):
    (tmp_path / "logapp.py").write_text(APP)
    routed = tmp_path / "routed.log"
    cfg = tmp_path / "gunicorn.conf.py"
    port = free_port()
    cfg.write_text(_conf(routed, port))
    # the master's lines go through the table's handler, not to its stderr
    m = master("logapp:app", "-c", str(cfg), "-w", "1", ready=None, bind=None)
    wait_for(lambda: routed.exists()
             and "ROUTED|sockherd.master|INFO|worker 1.0: ready" in routed.read_text(),
             10, "the master's routed line")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/orders", timeout=10) as r:
        assert r.read() == b"hello"
    # the app's, in the worker: the table reached it as data
    wait_for(lambda: "ROUTED|app.views|WARNING|served /orders" in routed.read_text(),
             10, "the worker's routed line")
    text = m.text()
    assert "logconfig_dict's logger 'gunicorn.error' gets nothing here" in text, text
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(30) == 0


def test_a_live_object_in_the_table_is_refused_where_it_is(tmp_path):
    (tmp_path / "good.py").write_text(APP)
    cfg = tmp_path / "gunicorn.conf.py"
    cfg.write_text("import sys\nlogconfig_dict = {'version': 1, 'handlers': {'out': "
                   "{'class': 'logging.StreamHandler', 'stream': sys.stdout}}}\n")
    r = check("-c", str(cfg), "good:app", cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "log_config.handlers.out.stream = <_io.TextIOWrapper" in r.stderr, r.stderr
    assert "'ext://sys.stderr'" in r.stderr, r.stderr


def test_a_toml_log_config_table_is_read_as_the_table(tmp_path):
    (tmp_path / "good.py").write_text(APP)
    cfg = tmp_path / "sockherd.toml"
    cfg.write_text('app = "good:app"\n[log_config]\nversion = 1\n'
                   '[log_config.root]\nlevel = "WARNING"\n')
    r = check("-c", str(cfg), "--print-config", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert 'log_config               = {"version": 1, "root": {"level": "WARNING"}}' \
        in r.stdout, r.stdout


def test_a_bad_table_refuses_the_start_with_dictconfigs_reason(tmp_path):
    import subprocess
    import sys

    (tmp_path / "good.py").write_text(APP)
    cfg = tmp_path / "sockherd.toml"
    cfg.write_text('app = "good:app"\nbind = ["127.0.0.1:0"]\n[log_config]\nversion = 1\n'
                   '[log_config.handlers.h]\nclass = "no.such.Handler"\n')
    out = subprocess.run([sys.executable, "-m", "sockherd.master", "run", "-c", str(cfg),
                          "--runtime-dir", str(tmp_path / "run")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert "log_config (a table): Unable to configure handler 'h'" in out.stderr, out.stderr
