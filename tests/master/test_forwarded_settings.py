"""The trusted-proxy settings (issue 24 §1, first bullet): forwarded_allow_ips
(also gunicorn's and uvicorn's FORWARDED_ALLOW_IPS), secure_scheme_headers
and forwarder_headers, declared once in master/settings_table.py, checked before
anything binds (exit 2 naming the bad item), and carried to real workers
of a real master: a spoofed X-Forwarded-For from an untrusted loopback
address changes nothing, the same from a trusted one is the client."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sockherd.master import settings as S
from sockherd.worker import forwarded as F
from test_run import master  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

WHO = """
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [("%s %s" % (environ["REMOTE_ADDR"], environ["wsgi.url_scheme"])).encode()]
"""


def test_defaults_are_gunicorns():
    s = S.resolve({}, env={})
    assert s.forwarded_allow_ips == ["127.0.0.1", "::1"]
    assert s.secure_scheme_headers == ["X-Forwarded-Protocol=ssl", "X-Forwarded-Proto=https",
                                       "X-Forwarded-Ssl=on"]
    assert s.forwarder_headers == []
    rules = F.parse(s.forwarded_allow_ips, s.secure_scheme_headers, s.forwarder_headers)
    assert [str(n) for n in rules.nets] == ["127.0.0.1/32", "::1/128"]
    assert rules.scheme == (("x-forwarded-protocol", "ssl"), ("x-forwarded-proto", "https"),
                            ("x-forwarded-ssl", "on"))


def test_environment_names():
    """FORWARDED_ALLOW_IPS (gunicorn, uvicorn) is read; ours wins over it;
    an empty value trusts nobody."""
    assert S.resolve({}, env={"FORWARDED_ALLOW_IPS": "10.0.0.0/8,*"}).forwarded_allow_ips == \
        ["10.0.0.0/8", "*"]
    s = S.resolve({}, env={"FORWARDED_ALLOW_IPS": "10.0.0.1",
                           "SOCKHERD_FORWARDED_ALLOW_IPS": "10.0.0.2"})
    assert s.forwarded_allow_ips == ["10.0.0.2"]
    s = S.resolve({}, env={"FORWARDED_ALLOW_IPS": ""})
    assert s.forwarded_allow_ips == [] and not F.parse(s.forwarded_allow_ips, [], []).on


def test_comma_lists_in_one_flag():
    rules = F.parse(["10.0.0.1, 192.168.0.0/16", "unix"], ["Front-End-Https=on"],
                    ["X-Forwarded-Host,x-forwarded-prefix"])
    assert [str(n) for n in rules.nets] == ["10.0.0.1/32", "192.168.0.0/16"]
    assert rules.unix and not rules.all and rules.forwarder == 1 | 4
    # a v4-mapped network is its IPv4 one: the engine compares a dual-stack
    # socket's v4-mapped peer as IPv4
    assert [str(n) for n in F.parse(["::ffff:10.0.0.0/104"], [], []).nets] == ["10.0.0.0/8"]


@pytest.mark.parametrize("env,message", [
    ({"SOCKHERD_FORWARDED_ALLOW_IPS": "10.0.0.1,localhost"},
     "forwarded_allow_ips: 'localhost' is not an address, a CIDR network, '*' or 'unix'"),
    ({"FORWARDED_ALLOW_IPS": "10.0.0.300"}, "forwarded_allow_ips: '10.0.0.300'"),
    ({"SOCKHERD_SECURE_SCHEME_HEADERS": "X-Forwarded-Proto"},
     "secure_scheme_headers: 'X-Forwarded-Proto' is not HEADER=VALUE"),
    ({"SOCKHERD_FORWARDER_HEADERS": "SCRIPT_NAME"},
     "forwarder_headers: 'SCRIPT_NAME' is not one of X-Forwarded-Host, X-Forwarded-Port, "
     "X-Forwarded-Prefix"),
])
def test_bad_values_refused_before_start(tmp_path: Path, env, message):
    (tmp_path / "who.py").write_text(WHO)
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("SOCKHERD_") and k != "FORWARDED_ALLOW_IPS"}
    r = subprocess.run([sys.executable, "-m", "sockherd.master", "check", "who:app"],
                       cwd=tmp_path, env={**full, **env}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and message in r.stderr, (r.stdout, r.stderr)


def get(port: int, source: str, headers: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10,
                                  source_address=(source, 0)) as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers.encode() +
                  b"\r\n")
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    return out.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_real_workers_trust_only_the_allowed_peer(master, tmp_path: Path, monkeypatch, how):
    (tmp_path / "who.py").write_text(WHO)
    monkeypatch.delenv("SOCKHERD_FORWARDED_ALLOW_IPS", raising=False)
    if how == "flag":
        monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
        m = master("who:app", "-w", "2", "--forwarded-allow-ips", "127.0.0.2,10.0.0.0/8")
    else:
        monkeypatch.setenv("FORWARDED_ALLOW_IPS", "127.0.0.2,10.0.0.0/8")
        m = master("who:app", "-w", "2")
    spoof = "X-Forwarded-For: 203.0.113.5, 10.1.1.1\r\nX-Forwarded-Proto: https\r\n"
    for _ in range(4):                 # whichever worker takes it
        assert get(m.port, "127.0.0.1", spoof) == b"127.0.0.1 http"
        assert get(m.port, "127.0.0.2", spoof) == b"203.0.113.5 https"
