"""Issue 36 review of master/cli_compat.py (32ec625), through the real
command: our own boolean --ws-per-message-deflate (settings_table.py; the
docs say `--ws-per-message-deflate` / `--no-ws-per-message-deflate`) was
read as uvicorn's, which takes true/false: the next word (the app, or the
next flag) was taken for its value and the command refused
("uvicorn's --ws-per-message-deflate 'app:app': true or false"). Fixed: a
value is taken only if the next word is one of true/false (1/0, yes/no,
on/off), as uvicorn's always has one."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

APP = 'def app(environ, start_response):\n    start_response("200 OK", [])\n    return [b"x"]\n'


def check(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    (tmp_path / "capp.py").write_text(APP)
    return subprocess.run([sys.executable, "-m", "sockherd", "check", "--print-config", *argv],
                          cwd=tmp_path, capture_output=True, text=True, timeout=50,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("SOCKHERD_")})


@pytest.mark.parametrize("argv, on", [
    (["--ws-per-message-deflate", "capp:app"], True),              # ours, before the app
    (["--ws-per-message-deflate", "-w", "2", "capp:app"], True),   # ours, before a flag
    (["capp:app", "--ws-per-message-deflate"], True),              # ours, last
    (["--ws-per-message-deflate", "false", "capp:app"], False),    # uvicorn's
    (["--ws-per-message-deflate", "True", "capp:app"], True),      # uvicorn's
    (["--ws-per-message-deflate=off", "capp:app"], False),         # uvicorn's
])
def test_our_own_ws_per_message_deflate_flag_and_uvicorns(tmp_path, argv, on):
    p = check(tmp_path, *argv)
    assert p.returncode == 0, p.stderr
    want = "true" if on else "false"
    assert any(line.split("#")[0].split() == ["ws_per_message_deflate", "=", want]
               for line in p.stdout.splitlines()), p.stdout


ASGI = "async def app(scope, receive, send):\n    pass\n"


@pytest.mark.parametrize("argv, interface", [
    (["-kuvicorn.workers.UvicornWorker"], "asgi"),     # argparse's (gunicorn's) attached form
    (["-k=uvicorn.workers.UvicornWorker"], "asgi"),
    (["-k", "uvicorn.workers.UvicornWorker"], "asgi"),
    (["--worker-class=uvicorn_worker.UvicornWorker"], "asgi"),
    (["-kgthread"], "auto"),
])
def test_gunicorns_k_in_each_of_its_forms(tmp_path, argv, interface):
    """-kCLASS and -k=CLASS (argparse reads them as -k CLASS, so gunicorn
    does) were passed as they were and refused: "invalid enum value
    'uvicorn.workers.UvicornWorker' (allowed: sync, gthread)". Fixed."""
    (tmp_path / "aapp.py").write_text(ASGI)
    p = check(tmp_path, *argv, "aapp:app")
    assert p.returncode == 0, p.stderr
    assert any(line.split("#")[0].split() == ["interface", "=", f'"{interface}"']
               for line in p.stdout.splitlines()), p.stdout
