"""A gunicorn or uvicorn command line runs unchanged where its meaning is
ours (issue 36 §5, master/cli_compat.py). Before: `--preload`,
`--worker-tmp-dir`, `--capture-output`, `--log-file`, `-n`, `-D`, `-e K=V`,
`--check-config` got argparse's "unrecognized arguments" after a 47-line
usage dump; uvicorn's `--host --port --workers --proxy-headers
--timeout-keep-alive --uds` were refused; `worker_class =
"uvicorn.workers.UvicornWorker"` and `raw_env` in a gunicorn.conf.py were
refused; an ignored config name was warned about again at every HUP.
Real masters on loopback and unix sockets."""
from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

ASGI = """
import os

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    mask = os.umask(0o22)
    os.umask(mask)
    body = ("%s %s umask %03o" % (os.environ.get("FOO", "-"), os.getppid(), mask)).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_unix(path: str) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return b"".join(iter(lambda: s.recv(65536), b""))


def get_tcp(port: int) -> bytes:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/")
    body = c.getresponse().read()
    c.close()
    return body


def sockherd(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sockherd", *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith("SOCKHERD_")})


def test_uvicorns_command_line_serves(master, tmp_path):
    (tmp_path / "uapp.py").write_text(ASGI)
    port, uds = free_port(), str(tmp_path / "u.sock")
    m = master("uapp:app", "--host", "127.0.0.1", "--port", str(port), "--uds", uds,
               "--workers", "1", "--proxy-headers", "--forwarded-allow-ips", "127.0.0.1",
               "--timeout-keep-alive", "5", "--ws-per-message-deflate", "false", bind=None,
               ready=1)
    assert get_tcp(port).startswith(b"- %d" % m.proc.pid)
    assert get_unix(uds).split(b"\r\n\r\n", 1)[1].startswith(b"- %d umask " % m.proc.pid)


def test_gunicorns_flags_run_with_a_word_each(master, tmp_path):
    (tmp_path / "uapp.py").write_text(ASGI)
    log = tmp_path / "error.log"
    m = master("uapp:app", "-w", "1", "--preload", "--worker-tmp-dir", "/dev/shm",
               "--capture-output", "--log-file", str(log), "-e", "FOO=bar", "-n", "shop",
               "-k", "uvicorn.workers.UvicornWorker", "-t", "30", ready=None)
    m.wait_log(r"gunicorn's --capture-output is ignored")
    text = m.text()
    for flag in ("--preload", "--worker-tmp-dir", "--capture-output"):
        assert f"gunicorn's {flag} is ignored: " in text, text
    assert "served as --interface asgi" in text
    wait_for(lambda: log.exists() and re.search(r"worker \d+\.\d+: ready", log.read_text()),
             30, "the worker ready, in --log-file's file")
    port = int(re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read_text()).group(1))
    assert get_tcp(port).startswith(b"bar ")      # -e: the workers' environment
    with open(f"/proc/{m.proc.pid}/cmdline", "rb") as f:
        assert f.read().startswith(b"sockherd: master [shop]")


@pytest.mark.parametrize("argv,said", [
    (("-D",), "gunicorn's -D is not supported by sockherd: run it under systemd"),
    (("--daemon",), "gunicorn's --daemon is not supported by sockherd"),
    (("--env-file", "x"), "uvicorn's --env-file is not supported by sockherd: give the "
                          "variables with -e KEY=VALUE"),
    (("--frobnicate",), "unrecognized arguments: --frobnicate (`sockherd run --help`"),
])
def test_what_we_do_not_do_is_one_line_and_exit_2(tmp_path, argv, said):
    (tmp_path / "uapp.py").write_text(ASGI)
    r = sockherd(tmp_path, "run", "uapp:app", "-b", "127.0.0.1:0", *argv)
    assert r.returncode == 2, r
    assert said in r.stderr and "usage:" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_check_config_checks_and_exits(tmp_path):
    (tmp_path / "uapp.py").write_text(ASGI)
    r = sockherd(tmp_path, "run", "uapp:app", "-b", "127.0.0.1:0", "--check-config")
    assert r.returncode == 0, r.stderr
    assert "settings valid; app uapp:app imports" in r.stdout


CONF = """
worker_class = "uvicorn.workers.UvicornWorker"
workers = 1
bind = "127.0.0.1:0"
raw_env = ["FOO=from-conf"]
preload_app = True
umask = 0o027
limit_request_line = 0
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"generic": {"format": "%(asctime)s [%(process)d] [%(levelname)s] %(message)s",
                               "datefmt": "[%Y-%m-%d %H:%M:%S %z]"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "generic",
                             "stream": "ext://sys.stderr"}},
    "root": {"level": "INFO", "handlers": ["console"]},
}
"""


def test_a_uvicorn_worker_conf_with_raw_env_runs_and_warns_once(master, tmp_path):
    (tmp_path / "uapp.py").write_text(ASGI)
    (tmp_path / "gunicorn.conf.py").write_text(CONF)
    m = master("-c", "gunicorn.conf.py", "uapp:app", bind=None, ready=None)
    port = int(m.wait_log(r"listening on 127\.0\.0\.1:(\d+)")[0])
    # logconfig_dict's format, in the master and in the worker
    m.wait_log(r"\[\d+\] \[INFO\] worker 1\.0: ready")
    got = get_tcp(port)
    assert got.startswith(b"from-conf ") and got.endswith(b" umask 027"), got
    warned = "gunicorn's preload_app = True is ignored"
    assert m.text().count(warned) == 1
    for gen in (2, 3):
        m.proc.send_signal(signal.SIGHUP)
        m.wait_log(rf"reload: generation {gen} serving")
    assert m.text().count(warned) == 1, m.text()


def test_the_flag_table_is_generated_from_the_flags():
    from sockherd.master import cli_compat

    doc = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text()
    assert cli_compat.docs_markdown() in doc, "docs/settings.md's flag table is stale: " \
        "regenerate it with `python -m sockherd.master.cli_compat`"


WSGI = """
def app(environ, start_response):
    body = b"%d" % len(environ["PATH_INFO"])
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
"""


def test_gunicorns_zero_limits_are_unlimited(master, tmp_path):
    """gunicorn's `limit_request_line = 0` (and field size, fields): no
    limit there; refused here before (at least 64). Now the most the engine
    takes (1 MiB, 32768 fields): a 20 kB request line is served."""
    (tmp_path / "wapp.py").write_text(WSGI)
    (tmp_path / "gunicorn.conf.py").write_text(
        "limit_request_line = 0\nlimit_request_field_size = 0\nlimit_request_fields = 0\n"
        "workers = 1\n")
    m = master("-c", "gunicorn.conf.py", "wapp:app", ready=1)
    path = "/" + "a" * 20000
    with socket.create_connection(("127.0.0.1", m.port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Big: {'b' * 20000}\r\n"
                  f"Connection: close\r\n\r\n".encode())
        got = b"".join(iter(lambda: s.recv(65536), b""))
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"20001"), got[:200]


def test_our_own_flag_of_the_same_name_is_ours():
    """--ws-per-message-deflate is ours (no value) and uvicorn's (true or
    false): ours was read as uvicorn's and took the next word as its value
    (`'--chdir': true or false`, found by the WebSocket tests)."""
    from sockherd.master.cli_compat import rewrite

    ours = ["run", "a:app", "--ws-per-message-deflate", "--chdir", "x"]
    assert rewrite(ours)[0] == ours
    assert rewrite(["run", "a:app", "--ws-per-message-deflate"])[0] == \
        ["run", "a:app", "--ws-per-message-deflate"]
    assert rewrite(["run", "a:app", "--ws-per-message-deflate", "False"])[0] == \
        ["run", "a:app", "--no-ws-per-message-deflate"]
    assert rewrite(["run", "a:app", "--ws-per-message-deflate=true"])[0] == \
        ["run", "a:app", "--ws-per-message-deflate"]


def test_no_other_flag_of_theirs_is_one_of_ours():
    """A flag both servers name is read as ours unless handled above."""
    from sockherd.master.cli_compat import FLAGS
    from sockherd.master.settings_table import SETTINGS

    ours = {f for s in SETTINGS for f in s.flags}
    ours |= {"--no-" + f[2:] for f in ours if f.startswith("--")}
    assert {n for f in FLAGS for n in f.names} & ours == {"--ws-per-message-deflate"}


UMASK_APP = """
import os

def app(environ, start_response):
    path = environ["QUERY_STRING"]
    open(path, "w").close()
    body = oct(os.stat(path).st_mode & 0o777).encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
"""


@pytest.mark.parametrize("how", ["flag", "conf"])
def test_umask_is_the_workers_file_mode_mask(master, tmp_path, how):
    """gunicorn's -m/--umask and `umask = 0o027`: refused before; now the
    files the app writes get it (and unix sockets keep --unix-mode)."""
    (tmp_path / "mapp.py").write_text(UMASK_APP)
    if how == "flag":
        m = master("mapp:app", "-w", "1", "-m", "027", ready=1)
    else:
        (tmp_path / "gunicorn.conf.py").write_text("umask = 0o027\nworkers = 1\n")
        m = master("-c", "gunicorn.conf.py", "mapp:app", ready=1)
    with socket.create_connection(("127.0.0.1", m.port), timeout=10) as s:
        s.sendall(f"GET /?{tmp_path / 'made'} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                  .encode())
        got = b"".join(iter(lambda: s.recv(65536), b""))
    assert got.endswith(b"0o640"), got
