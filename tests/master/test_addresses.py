"""Bind addresses, parsed before anything is bound: pure, no I/O."""
from __future__ import annotations

import pytest

from sockherd.master.addresses import Address, AddressError, parse

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("text,expect", [
    ("127.0.0.1:8000", Address("tcp", host="127.0.0.1", port=8000)),
    ("localhost:80", Address("tcp", host="localhost", port=80)),
    (":8000", Address("tcp", host="0.0.0.0", port=8000)),
    ("0.0.0.0:0", Address("tcp", host="0.0.0.0", port=0)),
    ("[::1]:8000", Address("tcp", host="::1", port=8000)),
    ("[::]:443", Address("tcp", host="::", port=443)),
    ("[0:0:0:0:0:0:0:1]:1", Address("tcp", host="::1", port=1)),
    ("unix:/run/app.sock", Address("unix", path="/run/app.sock")),
    ("unix:///run/app.sock", Address("unix", path="/run/app.sock")),
    ("fd://3", Address("fd", fd=3)),
])
def test_good(text, expect):
    assert parse(text) == expect


def test_round_trip():
    for text in ("127.0.0.1:8000", "[::1]:8000", "unix:/run/a.sock", "fd://7", "example.org:443"):
        assert str(parse(text)) == text


@pytest.mark.parametrize("text,reason", [
    ("8000", "expected host:port"),
    ("127.0.0.1:http", "port 'http' is not a number"),
    ("127.0.0.1:65536", "port '65536' is not a number from 0 to 65535"),
    ("127.0.0.1:-1", "not a number"),
    ("::1:8000", "write an IPv6 address in brackets"),
    ("[::1]8000", "written [address]:port"),
    ("[::g]:80", "is not an IPv6 address"),
    ("bad_host:80", "is not a host name or IPv4 address"),
    ("unix:relative.sock", "must be absolute"),
    ("unix:/" + "x" * 107, "longer than 107 bytes"),
    ("fd://three", "takes a file descriptor number"),
    ("fd://-1", "takes a file descriptor number"),
])
def test_bad(text, reason):
    with pytest.raises(AddressError) as exc:
        parse(text)
    assert reason in str(exc.value) and repr(text) in str(exc.value)
