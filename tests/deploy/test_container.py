"""deploy/container: the Containerfile, its settings (sockherd.toml) and app (hello.py).

* Static: the base image (Debian 12 slim), a non-root numeric USER, STOPSIGNAL
  SIGTERM, a HEALTHCHECK on /-/ready of the metrics listener, EXPOSE equal to
  the ports of sockherd.toml (bind + metrics), every COPY source present in
  the repository, the ENV paths consistent with what is copied where.
* The settings decode and the app imports (`sockherd check`, as the build does).
* The HEALTHCHECK's own command, run against a master started with the
  image's settings (ports moved to free ones on 127.0.0.1): exit 0 while it
  serves, non-zero once a graceful stop began (503 during unready_delay).
* The build itself (podman or buildah): only with SOCKHERD_TEST_CONTAINER_BUILD=1,
  since it takes minutes (apt-get, compiling the native parts), far beyond the
  seconds this suite allows, and needs the base image, which this sandbox
  cannot pull (no registry); SOCKHERD_TEST_CONTAINER_BASE names a local copy.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "deploy" / "container"
CONTAINERFILE = HERE / "Containerfile"
SETTINGS = HERE / "sockherd.toml"
SOCKHERD = str(Path(sys.executable).parent / "sockherd")

pytestmark = pytest.mark.timeout(60)


def instructions(path: Path = CONTAINERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        line = pending + stripped
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "a continuation line at the end of the file"
    return out


def final_stage(ins: list[tuple[str, str]]) -> list[tuple[str, str]]:
    last = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    return ins[last:]


def exec_form(args: str) -> list[str]:
    assert args.startswith("["), f"not exec form (a shell would be PID 1): {args}"
    return json.loads(args)


@pytest.fixture(scope="module")
def settings() -> dict:
    with open(SETTINGS, "rb") as f:
        return tomllib.load(f)


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def env_of(stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in stage:
        if word == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def test_base_image_is_debian_12_slim():
    ins = instructions()
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for w, a in ins if w == "ARG" and "=" in a}
    froms = [a.split()[0] for w, a in ins if w == "FROM"]
    assert len(froms) == 2, froms                     # a build stage, a runtime stage
    for image in froms:
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], image)
        assert image in ("docker.io/library/debian:bookworm-slim",
                         "docker.io/library/python:3.11-slim-bookworm"), image
    # no compiler in the runtime stage: only the venv is copied from the build
    final = final_stage(ins)
    assert not any("gcc" in a for w, a in final if w == "RUN")
    assert ("COPY", "--from=build /opt/sockherd /opt/sockherd") in final


def test_runs_as_numeric_non_root_user():
    users = [a for w, a in final_stage(instructions()) if w == "USER"]
    assert users, "no USER: the container would run as root"
    uid, _, gid = users[-1].partition(":")
    # numeric, so that Kubernetes' runAsNonRoot can check it without /etc/passwd
    assert uid.isdigit() and int(uid) != 0 and (not gid or int(gid) != 0), users[-1]
    assert f"useradd --uid {uid} " in CONTAINERFILE.read_text()


def test_stop_signal_and_entrypoint():
    final = final_stage(instructions())
    assert [a for w, a in final if w == "STOPSIGNAL"] == ["SIGTERM"]
    entry = exec_form([a for w, a in final if w == "ENTRYPOINT"][-1])
    cmd = exec_form([a for w, a in final if w == "CMD"][-1])
    assert entry + cmd == ["sockherd", "run"]         # the master is PID 1: it gets TERM


def healthcheck_command() -> list[str]:
    checks = [a for w, a in final_stage(instructions()) if w == "HEALTHCHECK"]
    assert len(checks) == 1, checks
    _, _, cmd = checks[0].partition(" CMD ")
    return exec_form(cmd.strip())


def test_healthcheck_hits_ready_on_the_metrics_port(settings):
    cmd = healthcheck_command()
    found = re.findall(r"http://127\.0\.0\.1:(\d+)(/[^'\"\s]*)", " ".join(cmd))
    assert found == [(str(port_of(settings["metrics"])), "/-/ready")], cmd


def test_expose_matches_the_settings(settings):
    exposed = set()
    for word, args in final_stage(instructions()):
        if word == "EXPOSE":
            exposed |= {int(p.split("/")[0]) for p in args.split()}
    wanted = {port_of(b) for b in settings["bind"]} | {port_of(settings["metrics"])}
    assert exposed == wanted
    # reachable from outside the container's network namespace
    for address in [*settings["bind"], settings["metrics"]]:
        assert address.rpartition(":")[0] in ("0.0.0.0", "[::]"), address


def test_copy_sources_exist_and_env_paths_agree(settings):
    ins = instructions()
    copied: dict[str, str] = {}
    for word, args in ins:
        if word == "COPY" and not args.startswith("--from"):
            *sources, dest = args.split()
            for src in sources:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
                copied[src.rstrip("/")] = dest
    assert copied["deploy/container/sockherd.toml"] == env_of(ins)["SOCKHERD_CONFIG"]
    assert copied["deploy/container/hello.py"] == f"{settings['chdir']}/hello.py"
    assert settings["app"] == "hello:app"
    # runtime dir below /run/sockherd (the Kubernetes emptyDir), not the dir itself
    assert Path(env_of(ins)["SOCKHERD_RUNTIME_DIR"]).parent == Path("/run/sockherd")
    assert "install -d -o 10001 -g 10001 -m 0700 /run/sockherd" in CONTAINERFILE.read_text()


def test_settings_valid_and_app_imports():
    run = subprocess.run([SOCKHERD, "check", "-c", str(SETTINGS), "--chdir", str(HERE)],
                         capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert run.returncode == 0, run.stderr
    assert "app hello:app imports" in run.stdout


# ---- the HEALTHCHECK command against a master with the image's settings ------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_healthcheck_command_follows_readiness(tmp_path, settings):
    port, metrics = free_port(), free_port()
    check = [sys.executable if w == "python3" else w for w in healthcheck_command()]
    check = [w.replace(f"127.0.0.1:{port_of(settings['metrics'])}", f"127.0.0.1:{metrics}")
             for w in check]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "SOCKHERD_CONFIG": str(SETTINGS), "SOCKHERD_CHDIR": str(HERE),
           "SOCKHERD_BIND": f"127.0.0.1:{port}", "SOCKHERD_METRICS": f"127.0.0.1:{metrics}",
           "SOCKHERD_RUNTIME_DIR": str(tmp_path / "rt"), "SOCKHERD_WORKERS": "1",
           "SOCKHERD_THREADS": "1", "SOCKHERD_UNREADY_DELAY": "1"}
    log = tmp_path / "master.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([SOCKHERD, "run"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while subprocess.run(check, capture_output=True, timeout=10).returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert b"hello from" in c.makefile("rb").read()
        stop = subprocess.run([SOCKHERD, "ctl", "stop"], env=env, capture_output=True,
                              text=True, timeout=10)
        assert stop.returncode == 0, stop.stderr
        # within unready_delay: the listener is still there, /-/ready says 503
        unready = subprocess.run(check, capture_output=True, text=True, timeout=10)
        assert unready.returncode != 0 and "503" in unready.stderr, unready.stderr
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


# ---- the build (opt-in) ------------------------------------------------------------------

def test_image_builds():
    tool = shutil.which("podman") or shutil.which("buildah")
    if not os.environ.get("SOCKHERD_TEST_CONTAINER_BUILD"):
        pytest.skip("the image build takes minutes (apt-get, compiling the native parts) and "
                    "needs the base image: set SOCKHERD_TEST_CONTAINER_BUILD=1 (and "
                    "SOCKHERD_TEST_CONTAINER_BASE=a local copy when no registry is reachable)")
    if tool is None:
        pytest.skip("neither podman nor buildah is installed (apt-get install podman)")
    base = os.environ.get("SOCKHERD_TEST_CONTAINER_BASE", "docker.io/library/debian:bookworm-slim")
    if subprocess.run([tool, "image", "exists" if tool.endswith("podman") else "inspect", base],
                      capture_output=True).returncode != 0:
        pulled = subprocess.run([tool, "pull", base], capture_output=True, text=True,
                                timeout=300)
        if pulled.returncode != 0:
            pytest.skip(f"base image {base} neither present nor pullable: "
                        f"{pulled.stderr.strip().splitlines()[-1:]}")
    tag = "localhost/sockherd-hello:test"
    # chroot isolation: no OCI runtime needed (crun/runc cannot create
    # containers in every sandbox); --format docker keeps the HEALTHCHECK
    build = [tool, "build"] if tool.endswith("podman") else [tool, "bud"]
    run = subprocess.run([*build, "--isolation=chroot", "--network=host", "--format", "docker",
                          "--build-arg", f"BASE={base}", "-f", str(CONTAINERFILE), "-t", tag,
                          str(ROOT)], capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    info = json.loads(subprocess.run([tool, "inspect", tag], capture_output=True, text=True,
                                     check=True).stdout)[0]
    config = info.get("Config") or info.get("config") or {}
    assert config.get("User") == "10001:10001" and config.get("StopSignal") == "SIGTERM"
    assert set(config.get("ExposedPorts", {})) == {"8000/tcp", "9100/tcp"}
    health = info.get("Healthcheck") or info.get("HealthCheck") or config.get("Healthcheck") or {}
    assert "/-/ready" in " ".join(health.get("Test", [])), info
    # the image's own settings and app, as its user (chroot: no OCI runtime)
    buildah = shutil.which("buildah")
    if buildah:
        ctr = subprocess.run([buildah, "from", tag], capture_output=True, text=True,
                             check=True).stdout.strip()
        try:
            check = subprocess.run([buildah, "run", "--isolation", "chroot", ctr, "--", "sh",
                                    "-c", "id -u && sockherd check"], capture_output=True,
                                   text=True, timeout=120)
        finally:
            subprocess.run([buildah, "rm", ctr], capture_output=True)
        assert check.returncode == 0, check.stderr
        assert check.stdout.startswith("10001\n") and "app hello:app imports" in check.stdout
