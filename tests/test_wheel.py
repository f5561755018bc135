"""A built wheel, installed as a user installs it (issue 24 §6): `pip wheel`
of this checkout, installed into a fresh venv in a temporary directory,
`sockherd run` there on an app of another temporary directory (never this
source tree: no PYTHONPATH, another working directory) serving a request.
Compiles the C extensions: slow (a minute or two), but it is the only
proof that the native engine and fdcore reach users.

The venv gets the runtime dependencies at the versions requirements/lock.txt
pins (issue 34: the clean-machine check) and nothing of the test stack; the
same wheel then serves a WSGI app and an ASGI app. Under `make test` this runs
on 3.11 and on 3.13, each building its own wheel."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.timeout(1200), pytest.mark.long]

APP = '''
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"served from the wheel"]


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"served from the wheel, ASGI"})
'''
LOCK = ROOT / "requirements" / "lock.txt"
RUNTIME = ("cffi", "python-prctl", "pyzmq", "msgspec", "prometheus-client")
sys.path.insert(0, str(ROOT / "toolchain"))
from lockcheck import canonical, read_lock  # noqa: E402  (the lock's one parser)


def poll(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := fn()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def test_a_wheel_installs_into_a_fresh_venv_and_serves(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist),
                            str(ROOT)], capture_output=True, text=True, timeout=900, env=env,
                           cwd=tmp_path)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert "is absent from the `packages` configuration" not in build.stdout + build.stderr
    wheel = next(dist.glob("sockherd-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for ext in ("sockherd/worker/_http", "sockherd/fdcore/_fdcore", "sockherd/ipc/_depth",
                "sockherd/worker/_aio"):
        assert any(n.startswith(ext) and n.endswith(".so") for n in names), (ext, names)
    assert not [n for n in names if n.startswith("tests/") or n.endswith((".c", ".h"))], names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    inst = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-c", str(LOCK),
                           str(wheel)], capture_output=True, text=True, timeout=900,
                          env={**env, "PIP_CONSTRAINT": str(LOCK)}, cwd=tmp_path)
    assert inst.returncode == 0, inst.stdout[-3000:] + inst.stderr[-3000:]
    # runtime dependencies only (the test stack is not pulled in), each at the lock's version
    listed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=freeze"],
                            capture_output=True, text=True, timeout=120, env=env).stdout.lower()
    assert "pytest" not in listed and "fastapi" not in listed, listed
    have = {canonical(name): version
            for name, _, version in (line.partition("==") for line in listed.split())
            if version}
    pins = read_lock(str(LOCK))
    for name in RUNTIME:
        assert have.get(name) == pins[name], (name, have.get(name), pins[name])

    site = tmp_path / "site"
    site.mkdir()
    (site / "wheelapp.py").write_text(APP)
    # the script, and `python -m sockherd` (issue 36: uvicorn's and gunicorn's way)
    for spec, answer, command in (
            ("wheelapp:app", b"served from the wheel", [str(venv / "bin" / "sockherd")]),
            ("wheelapp:asgi", b"served from the wheel, ASGI",
             [str(venv / "bin" / "python"), "-m", "sockherd"])):
        serve(venv, site, spec, answer, tmp_path / spec.replace(":", "-"), env, command)


def serve(venv: Path, site: Path, spec: str, answer: bytes, tmp_path: Path, env: dict,
          command: list[str]):
    """`COMMAND run SPEC` from the venv in site/, one request answered with answer,
    a TERM that ends it with status 0."""
    tmp_path.mkdir()
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*command, "run", spec,
                                 "-w", "1", "-b", "127.0.0.1:0",
                                 "--runtime-dir", str(tmp_path / "rt")],
                                stdout=out, stderr=subprocess.STDOUT, cwd=site, env=env)
    try:
        port = int(poll(lambda: re.findall(r"listening on 127\.0\.0\.1:(\d+)",
                                           log.read_text()), 120, "the port")[0])
        poll(lambda: "ready" in log.read_text(), 120, "the worker ready")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.read() == answer
        # the code that served it is the venv's, not this checkout's
        where = subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sockherd.worker._http as m; print(m.__file__)"],
                               capture_output=True, text=True, timeout=60, cwd=site, env=env)
        assert where.stdout.startswith(str(venv)), where
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
