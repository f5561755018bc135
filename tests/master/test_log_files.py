"""Log files (issue 24 §4) on a real master and workers: access and error
logs in files, USR1 under load (logrotate's rename + postrotate) with every
access line present exactly once and none split, the exact access format
with gunicorn's atoms, JSON lines, a dictConfig file, and a file that cannot
be opened refusing the start."""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading

import pytest

from test_run import master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

APP = """
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("X-Served-By", "unit-7")])
    return [b"hello"]
"""


@pytest.fixture
def logapp(tmp_path):
    (tmp_path / "logapp.py").write_text(APP)
    return "logapp:app"


def get(port: int, path: str, headers: dict | None = None) -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


def lines(*paths) -> list[str]:
    out: list[str] = []
    for p in paths:
        if os.path.exists(p):
            with open(p, "rb") as f:
                data = f.read().decode()
            assert data == "" or data.endswith("\n"), f"{p}: a line cut short: {data[-80:]!r}"
            out += data.splitlines()
    return out


def test_usr1_under_load_loses_and_splits_no_access_line(master, tmp_path, logapp):
    access, error = tmp_path / "access.log", tmp_path / "error.log"
    m = master(logapp, "-w", "2", "--threads", "2", "--access-logfile", str(access),
               "--error-logfile", str(error), "--access-log-format", "%(U)s %(s)s %(p)s",
               ready=0)
    wait_for(lambda: len(re.findall(r"worker \d+\.\d+: ready", error.read_text())) >= 2
             if error.exists() else False, 30, "two workers ready in the error log")
    m.port = int(re.findall(r"listening on 127\.0\.0\.1:(\d+)", error.read_text())[0])
    sent: list[str] = []
    failures: list[str] = []
    stop = threading.Event()

    def client(k: int) -> None:
        n = 0
        while not stop.is_set():
            path = f"/c{k}/{n}"
            try:
                if get(m.port, path) == 200:
                    sent.append(path)
                else:
                    failures.append(path)
            except OSError as exc:
                failures.append(f"{path}: {exc!r}")
            n += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        for rotation in range(1, 4):
            wait_for(lambda: len(sent) > 60 * rotation, 20, "traffic")
            os.rename(access, f"{access}.{rotation}")
            os.rename(error, f"{error}.{rotation}")
            m.proc.send_signal(signal.SIGUSR1)
            wait_for(lambda: access.exists() and error.exists()
                     and "USR1: log files reopened" in error.read_text(), 20,
                     "the reopened files")
            seen = len(sent)
            wait_for(lambda: len(sent) > seen + 30, 20, "traffic after the reopen")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert failures == []
    rotated = [f"{access}.{i}" for i in (1, 2, 3)]
    # the last responses' lines are written when their responses end: poll
    wait_for(lambda: len(lines(*rotated, access)) >= len(sent), 10, "every access line")
    got = lines(*rotated, access)
    assert all(re.fullmatch(r"/c\d/\d+ 200 <\d+>", x) for x in got), \
        [x for x in got if not re.fullmatch(r"/c\d/\d+ 200 <\d+>", x)][:5]
    paths = [x.split()[0] for x in got]
    assert sorted(paths) == sorted(sent)             # each exactly once
    # each file got lines, from both workers once they reopened
    for p in rotated[1:] + [access]:
        assert len({x.split()[2] for x in lines(p)}) == 2, p
    # the error log moved too: the new file has the workers' lines since
    assert "worker" in error.read_text()


def test_access_line_is_exactly_the_format_with_gunicorns_atoms(master, tmp_path, logapp):
    access = tmp_path / "access.log"
    fmt = ('%(h)s %(l)s %(u)s %(t)s "%(r)s" %(m)s %(U)s %(q)s %(H)s %(s)s %(B)s %(b)s '
           '"%(f)s" "%(a)s" %(T)s %(M)s %(D)s %(L)s %(p)s %({x-trace}i)s %({X-Served-By}o)s '
           '%(REQUEST_METHOD)s %({SERVER_NAME}e)s %(nope)s')
    m = master(logapp, "-w", "1", "--access-logfile", str(access), "--access-log-format", fmt,
               ready=1)
    assert get(m.port, "/a/b?c=d", {"Referer": "http://r/", "User-Agent": "probe/2",
                                    "X-Trace": "t-42",
                                    "Authorization": "Basic YWxpY2U6c2VjcmV0"}) == 200
    wait_for(lambda: access.exists() and access.read_text(), 10, "the access line")
    line = access.read_text()
    pat = (r'127\.0\.0\.1 - alice \[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\] '
           r'"GET /a/b\?c=d HTTP/1\.1" GET /a/b c=d HTTP/1\.1 200 5 5 "http://r/" "probe/2" '
           r'0 \d+ \d+ \d+\.\d{6} <\d+> t-42 unit-7 - 127\.0\.0\.1 -\n')
    assert re.fullmatch(pat, line), line


def test_json_lines_in_both_logs(master, tmp_path, logapp):
    access, error = tmp_path / "access.log", tmp_path / "error.log"
    m = master(logapp, "-w", "1", "--access-logfile", str(access), "--error-logfile",
               str(error), "--log-format", "json", ready=0)
    wait_for(lambda: error.exists() and '"worker 1.0: ready' in error.read_text(), 30,
             "the worker ready")
    port = int(re.findall(r"listening on 127\.0\.0\.1:(\d+)", error.read_text())[0])
    assert get(port, "/j?k=1", {"User-Agent": "probe/3"}) == 200
    wait_for(lambda: access.exists() and access.read_text(), 10, "the access line")
    doc = json.loads(access.read_text())
    assert {k: doc[k] for k in ("method", "path", "query", "status", "bytes", "user_agent",
                                "remote_addr")} == {
        "method": "GET", "path": "/j", "query": "k=1", "status": 200, "bytes": 5,
        "user_agent": "probe/3", "remote_addr": "127.0.0.1"}
    assert isinstance(doc["duration_us"], int) and doc["request"] == "GET /j?k=1 HTTP/1.1"
    records = [json.loads(x) for x in lines(error)]
    assert {r["process"] for r in records} == {"master", "worker"}
    assert all(set(r) >= {"time", "level", "logger", "process", "pid", "message"}
               for r in records)
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(30) == 0


@pytest.mark.parametrize("kind", ["json", "toml"])
def test_a_dict_config_file_routes_the_loggers(master, tmp_path, logapp, kind):
    routed = tmp_path / "master-only.log"
    conf = {"version": 1, "disable_existing_loggers": False,
            "formatters": {"bare": {"format": "MASTER|%(levelname)s|%(message)s"}},
            "handlers": {"file": {"class": "logging.FileHandler", "filename": str(routed),
                                  "formatter": "bare"}},
            "loggers": {"sockherd.master": {"handlers": ["file"], "level": "INFO"}}}
    path = tmp_path / f"logging.{kind}"
    if kind == "json":
        path.write_text(json.dumps(conf))
    else:
        path.write_text(
            'version = 1\ndisable_existing_loggers = false\n'
            '[formatters.bare]\nformat = "MASTER|%(levelname)s|%(message)s"\n'
            f'[handlers.file]\nclass = "logging.FileHandler"\nfilename = "{routed}"\n'
            'formatter = "bare"\n[loggers."sockherd.master"]\nhandlers = ["file"]\n'
            'level = "INFO"\n')
    master(logapp, "-w", "1", "--log-config", str(path), ready=1)
    wait_for(lambda: routed.exists() and "MASTER|INFO|worker 1.0: ready" in routed.read_text(),
             10, "the routed master line")


@pytest.mark.parametrize("flag, value, said", [
    ("--error-logfile", "/nonexistent-dir/e.log", "error_logfile = '/nonexistent-dir/e.log'"),
    ("--access-logfile", "/nonexistent-dir/a.log", "access_logfile = '/nonexistent-dir/a.log'"),
    ("--log-config", "/nonexistent-dir/l.json", "log_config = '/nonexistent-dir/l.json'"),
])
def test_a_log_file_that_cannot_be_opened_refuses_the_start(tmp_path, flag, value, said):
    out = subprocess.run([sys.executable, "-m", "sockherd.master", "run", "-b", "127.0.0.1:0",
                          flag, value, "--runtime-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert said in out.stderr and "No such file or directory" in out.stderr, out.stderr
