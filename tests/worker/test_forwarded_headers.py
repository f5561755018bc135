"""Trusted proxy headers on the WSGI engine (issue 24 §1, first bullet): from
a peer in forwarded_allow_ips, X-Forwarded-For / Forwarded set REMOTE_ADDR
(the rightmost address not itself trusted), the scheme headers and
Forwarded's proto= set wsgi.url_scheme and HTTPS, X-Forwarded-Host / -Port
/ -Prefix only when forwarder_headers names them; from any other peer
nothing changes but the raw header. A real worker Loop over a real fdcore
Table (in-process, as conftest.py's serve_wsgi), listening on loopback
IPv4, IPv6 and a unix socket; raw sockets, so that every header is sent
exactly as written (spoofed, repeated, malformed)."""
from __future__ import annotations

import json
import logging
import socket
import time

import pytest

from sockherd.fdcore import Table
from sockherd.worker.loop import Loop
from sockherd.worker.wsgi import make_handler

pytestmark = pytest.mark.timeout(60)

KEYS = ("REMOTE_ADDR", "REMOTE_PORT", "wsgi.url_scheme", "HTTPS", "HTTP_HOST", "SERVER_NAME",
        "SERVER_PORT", "SCRIPT_NAME", "PATH_INFO", "HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED",
        "HTTP_X_FORWARDED_PROTO")


def echo(environ, start_response):
    body = json.dumps({k: environ.get(k) for k in KEYS}).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]


@pytest.fixture
def serve_on(tmp_path):
    """start(app, where="127.0.0.1" | "::1" | "unix", asgi=False, **settings)
    -> the listener's address: a worker loop of one thread on it."""
    made = []

    def start(app, where="127.0.0.1", asgi=False, **cfg):
        cfg = {"threads": 1, **cfg}
        if asgi:
            from sockherd.worker.asgi import make_handler as make_asgi_handler
            handler = make_asgi_handler(app, cfg, None)
        else:
            handler = make_handler(app, cfg)
        table = Table(1, 1)
        loop = Loop(table, handler)
        made.append((loop, table))
        if where == "unix":
            addr = str(tmp_path / f"s{len(made)}.sock")
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            srv.bind(addr)
            srv.listen(64)
        else:
            fam = socket.AF_INET6 if ":" in where else socket.AF_INET
            srv = socket.create_server((where, 0), family=fam, backlog=64)
            addr = srv.getsockname()[:2]
        loop.add_listener(srv)
        loop.start()
        return addr

    yield start
    for loop, table in made:
        loop.stop()
        table.close()
        assert not loop.errors, loop.errors


def request(path="/", headers=(), host="backend.local") -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def read_response(c: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = c.recv(65536)
        assert chunk, f"connection closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int([ln.split(b":")[1] for ln in head.split(b"\r\n")
                  if ln.lower().startswith(b"content-length:")][0])
    while len(body) < length:
        chunk = c.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return int(head.split()[1]), body[:length]


def connect(addr, source: str | None = None) -> socket.socket:
    if isinstance(addr, str):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(10)
        c.connect(addr)
        return c
    return socket.create_connection(addr, timeout=10,
                                    source_address=(source, 0) if source else None)


def ask(addr, headers=(), source=None, path="/", host="backend.local") -> dict:
    """What the app saw for one request with these header lines."""
    with connect(addr, source) as c:
        c.sendall(request(path, headers, host))
        status, body = read_response(c)
    assert status == 200, body
    return json.loads(body)


SPOOF = [("X-Forwarded-For", "203.0.113.66"), ("X-Forwarded-Proto", "https"),
         ("X-Forwarded-Ssl", "on"), ("Forwarded", 'for=198.51.100.9;proto=https;host=evil.example'),
         ("X-Forwarded-Host", "evil.example"), ("X-Forwarded-Port", "443"),
         ("X-Forwarded-Prefix", "/evil")]
ALL_FORWARDER = ["X-Forwarded-Host", "X-Forwarded-Port", "X-Forwarded-Prefix"]


# ---- trusted and untrusted peers -------------------------------------------------------------


def test_default_trusts_loopback_for_address_and_scheme(serve_on):
    addr = serve_on(echo)
    env = ask(addr, [("X-Forwarded-For", "203.0.113.7"), ("X-Forwarded-Proto", "https")])
    assert env["REMOTE_ADDR"] == "203.0.113.7" and env["REMOTE_PORT"] == "0"
    assert env["wsgi.url_scheme"] == "https" and env["HTTPS"] == "on"
    # the raw headers stay as they came
    assert env["HTTP_X_FORWARDED_FOR"] == "203.0.113.7" and env["HTTP_X_FORWARDED_PROTO"] == "https"
    # without them: the peer, plain http
    env = ask(addr)
    assert env["REMOTE_ADDR"] == "127.0.0.1" and env["wsgi.url_scheme"] == "http"
    assert env["HTTPS"] is None


def test_spoofed_headers_from_an_untrusted_peer_change_nothing(serve_on):
    """Only 127.0.0.2 is trusted: the same spoofed headers from 127.0.0.1
    leave every key as it was, and from 127.0.0.2 they apply."""
    addr = serve_on(echo, forwarded_allow_ips=["127.0.0.2"], forwarder_headers=ALL_FORWARDER)
    plain = ask(addr, source="127.0.0.1")
    env = ask(addr, SPOOF, source="127.0.0.1")
    for k in ("REMOTE_ADDR", "wsgi.url_scheme", "HTTPS", "HTTP_HOST", "SERVER_NAME",
              "SERVER_PORT", "SCRIPT_NAME", "PATH_INFO"):
        assert env[k] == plain[k], k
    assert env["REMOTE_ADDR"] == "127.0.0.1" and env["wsgi.url_scheme"] == "http"
    assert env["HTTP_X_FORWARDED_FOR"] == "203.0.113.66"       # the raw header is the app's
    trusted = ask(addr, SPOOF, source="127.0.0.2")
    assert trusted["REMOTE_ADDR"] == "198.51.100.9"            # Forwarded wins over XFF
    assert trusted["wsgi.url_scheme"] == "https" and trusted["HTTPS"] == "on"
    assert trusted["HTTP_HOST"] == "evil.example" and trusted["SERVER_PORT"] == "443"
    assert trusted["SCRIPT_NAME"] == "/evil"


def test_empty_allow_list_trusts_nobody(serve_on):
    addr = serve_on(echo, forwarded_allow_ips=[])
    env = ask(addr, SPOOF)
    assert env["REMOTE_ADDR"] == "127.0.0.1" and env["wsgi.url_scheme"] == "http"


def test_each_request_of_a_kept_alive_connection_is_its_own(serve_on):
    """The trust is the connection's, the values each request's: a second
    request without the headers gets none of the first one's."""
    addr = serve_on(echo)
    with connect(addr) as c:
        c.sendall(request(headers=[("X-Forwarded-For", "203.0.113.7"),
                                   ("X-Forwarded-Proto", "https")]))
        first = json.loads(read_response(c)[1])
        c.sendall(request())
        second = json.loads(read_response(c)[1])
    assert first["REMOTE_ADDR"] == "203.0.113.7" and first["wsgi.url_scheme"] == "https"
    assert second["REMOTE_ADDR"] == "127.0.0.1" and second["wsgi.url_scheme"] == "http"
    assert second["HTTPS"] is None and second["REMOTE_PORT"] != "0"


def test_cidr_and_star(serve_on):
    addr = serve_on(echo, forwarded_allow_ips=["127.0.0.0/30"])
    assert ask(addr, [("X-Forwarded-For", "192.0.2.1")], source="127.0.0.3")["REMOTE_ADDR"] \
        == "192.0.2.1"
    assert ask(addr, [("X-Forwarded-For", "192.0.2.1")], source="127.0.0.4")["REMOTE_ADDR"] \
        == "127.0.0.4"
    # "*": every peer, and every hop: the leftmost address is the client
    addr = serve_on(echo, forwarded_allow_ips=["*"])
    env = ask(addr, [("X-Forwarded-For", "192.0.2.1, 198.51.100.2, 203.0.113.3")],
              source="127.0.0.9")
    assert env["REMOTE_ADDR"] == "192.0.2.1"


# ---- X-Forwarded-For chains ---------------------------------------------------------------


@pytest.mark.parametrize("fields,client", [
    # the proxies (10/8) appended what they received from; the client's own
    # claim (198.51.100.1) is left of the first untrusted address
    ([("X-Forwarded-For", "198.51.100.1, 203.0.113.9, 10.1.2.3, 10.4.5.6")], "203.0.113.9"),
    ([("X-Forwarded-For", "203.0.113.9,10.1.2.3")], "203.0.113.9"),
    # every hop trusted: the leftmost
    ([("X-Forwarded-For", "10.9.9.9, 10.1.2.3")], "10.9.9.9"),
    # repeated fields are one list in order
    ([("X-Forwarded-For", "198.51.100.1"), ("X-Forwarded-For", "203.0.113.9, 10.0.0.1")],
     "203.0.113.9"),
    ([("X-Forwarded-For", "198.51.100.1"), ("X-Forwarded-For", "10.0.0.1")], "198.51.100.1"),
    # empty list elements are nothing
    ([("X-Forwarded-For", " , 203.0.113.9 ,, 10.0.0.1 ,")], "203.0.113.9"),
    # ports and IPv6 spellings
    ([("X-Forwarded-For", "203.0.113.9:4711")], "203.0.113.9"),
    ([("X-Forwarded-For", "2001:db8::5, 10.0.0.1")], "2001:db8::5"),
    ([("X-Forwarded-For", "[2001:DB8::5]:80")], "2001:db8::5"),
])
def test_x_forwarded_for_chains(serve_on, fields, client):
    addr = serve_on(echo, forwarded_allow_ips=["127.0.0.1", "10.0.0.0/8"])
    assert ask(addr, fields)["REMOTE_ADDR"] == client


def test_port_of_an_entry_is_remote_port(serve_on):
    addr = serve_on(echo)
    env = ask(addr, [("X-Forwarded-For", "203.0.113.9:4711")])
    assert (env["REMOTE_ADDR"], env["REMOTE_PORT"]) == ("203.0.113.9", "4711")


# ---- RFC 7239 Forwarded -------------------------------------------------------------------


@pytest.mark.parametrize("fields,client,port,scheme", [
    ([("Forwarded", "for=192.0.2.60;proto=https;by=203.0.113.43")], "192.0.2.60", "0", "https"),
    ([("Forwarded", 'For="[2001:db8:cafe::17]:4711"')], "2001:db8:cafe::17", "4711", "http"),
    ([("Forwarded", 'for="192.0.2.43:47011";PROTO=HTTPS')], "192.0.2.43", "47011", "https"),
    # a chain: the element of the rightmost untrusted for= gives proto too
    ([("Forwarded", "for=192.0.2.1;proto=https, for=10.0.0.5;proto=http")],
     "192.0.2.1", "0", "https"),
    ([("Forwarded", "for=198.51.100.1;proto=http"), ("Forwarded", "for=192.0.2.1;proto=https")],
     "192.0.2.1", "0", "https"),
    # obfuscated or unknown: the client is not known, its proto is
    ([("Forwarded", "for=_hidden;proto=https")], "127.0.0.1", None, "https"),
    ([("Forwarded", "for=unknown;proto=https, for=10.0.0.5")], "127.0.0.1", None, "https"),
    # Forwarded wins over X-Forwarded-*, attribute by attribute
    ([("X-Forwarded-For", "198.51.100.1"), ("Forwarded", "for=192.0.2.60"),
      ("X-Forwarded-Proto", "https")], "192.0.2.60", "0", "https"),
    ([("X-Forwarded-Proto", "http"), ("Forwarded", "proto=https"),
      ("X-Forwarded-For", "198.51.100.1")], "198.51.100.1", "0", "https"),
])
def test_forwarded(serve_on, fields, client, port, scheme):
    addr = serve_on(echo, forwarded_allow_ips=["127.0.0.1", "10.0.0.0/8"])
    env = ask(addr, fields)
    assert env["REMOTE_ADDR"] == client and env["wsgi.url_scheme"] == scheme
    if port is not None:
        assert env["REMOTE_PORT"] == port
    assert env["HTTPS"] == ("on" if scheme == "https" else None)


# ---- malformed values: ignored, logged at debug, never an error -------------------------


@pytest.mark.parametrize("fields", [
    [("X-Forwarded-For", "not-an-address")],
    [("X-Forwarded-For", "203.0.113.9, garbage")],
    [("X-Forwarded-For", "203.0.113.9:99999")],
    [("X-Forwarded-For", "999.1.1.1")],
    [("Forwarded", 'for="192.0.2.1')],                      # unterminated quote
    [("Forwarded", r'for="192.0.2.1\"x"')],                 # quoted-pair
    [("Forwarded", "for=[2001:db8::1]")],                   # brackets must be quoted
    [("Forwarded", "for=192.0.2.1;for=192.0.2.2")],         # a parameter twice
    [("Forwarded", "for 192.0.2.1")],
    # more trusted hops than we read (a long chain of untrusted ones is
    # fine: the walk stops at the rightmost, test_forwarded_from_the_right.py)
    [("Forwarded", ",".join(["for=127.0.0.1"] * 40))],
    [("X-Forwarded-Proto", "https"), ("X-Forwarded-Ssl", "off")],   # they disagree
])
def test_malformed_values_are_ignored_and_logged(serve_on, fields, caplog):
    caplog.set_level(logging.DEBUG, logger="sockherd.forwarded")
    addr = serve_on(echo)
    env = ask(addr, fields)
    assert env["REMOTE_ADDR"] == "127.0.0.1"
    assert env["wsgi.url_scheme"] == "http"
    assert any("ignored a malformed" in r.getMessage() for r in caplog.records), caplog.text


def test_malformed_proto_of_forwarded_leaves_the_scheme_headers(serve_on, caplog):
    caplog.set_level(logging.DEBUG, logger="sockherd.forwarded")
    addr = serve_on(echo)
    env = ask(addr, [("Forwarded", "for=192.0.2.1;proto=ftp"), ("X-Forwarded-Proto", "https")])
    assert env["REMOTE_ADDR"] == "192.0.2.1" and env["wsgi.url_scheme"] == "https"
    assert "ignored a malformed Forwarded" in caplog.text


def test_rightmost_scheme_value_wins(serve_on):
    """An appending proxy adds its own after the client's: the last one."""
    addr = serve_on(echo)
    env = ask(addr, [("X-Forwarded-Proto", "https"), ("X-Forwarded-Proto", "http")])
    assert env["wsgi.url_scheme"] == "http" and env["HTTPS"] is None
    env = ask(addr, [("X-Forwarded-Proto", "http, https")])
    assert env["wsgi.url_scheme"] == "https"


def test_scheme_headers_setting(serve_on):
    addr = serve_on(echo, secure_scheme_headers=["Front-End-Https=on"])
    assert ask(addr, [("X-Forwarded-Proto", "https")])["wsgi.url_scheme"] == "http"
    assert ask(addr, [("Front-End-Https", "ON")])["wsgi.url_scheme"] == "https"
    addr = serve_on(echo, secure_scheme_headers=[])
    assert ask(addr, [("X-Forwarded-Proto", "https")])["wsgi.url_scheme"] == "http"


# ---- X-Forwarded-Host / -Port / -Prefix: only when named ----------------------------------


def test_forwarder_headers_only_when_named(serve_on):
    fields = [("X-Forwarded-Host", "shop.example:8443"), ("X-Forwarded-Prefix", "/api/")]
    addr = serve_on(echo)
    env = ask(addr, fields, path="/items")
    assert env["HTTP_HOST"] == "backend.local" and env["SCRIPT_NAME"] == ""
    addr = serve_on(echo, forwarder_headers=["x-forwarded-host"])
    env = ask(addr, fields, path="/items")
    assert (env["HTTP_HOST"], env["SERVER_NAME"], env["SERVER_PORT"]) == \
        ("shop.example:8443", "shop.example", "8443")
    assert env["SCRIPT_NAME"] == ""
    addr = serve_on(echo, forwarder_headers=["X-Forwarded-Prefix,X-Forwarded-Port"])
    env = ask(addr, fields + [("X-Forwarded-Port", "443")], path="/items")
    assert env["HTTP_HOST"] == "backend.local"
    assert (env["SCRIPT_NAME"], env["PATH_INFO"], env["SERVER_PORT"]) == ("/api", "/items", "443")


def test_forwarded_host_and_scheme_default_port(serve_on):
    addr = serve_on(echo, forwarder_headers=ALL_FORWARDER)
    env = ask(addr, [("Forwarded", 'for=192.0.2.1;host="shop.example";proto=https'),
                     ("X-Forwarded-Host", "other.example")])
    assert (env["HTTP_HOST"], env["SERVER_NAME"], env["SERVER_PORT"]) == \
        ("shop.example", "shop.example", "443")
    env = ask(addr, [("X-Forwarded-Host", "[2001:db8::1]:8080")])
    assert (env["SERVER_NAME"], env["SERVER_PORT"]) == ("[2001:db8::1]", "8080")


def test_prefix_goes_before_root_path(serve_on):
    addr = serve_on(echo, forwarder_headers=["X-Forwarded-Prefix"], root_path="/app")
    env = ask(addr, [("X-Forwarded-Prefix", "/edge")], path="/app/x")
    assert (env["SCRIPT_NAME"], env["PATH_INFO"]) == ("/edge/app", "/x")


@pytest.mark.parametrize("field,value", [
    ("X-Forwarded-Host", "evil.example/path"), ("X-Forwarded-Host", "a b"),
    ("X-Forwarded-Host", "shop.example:0"), ("X-Forwarded-Port", "http"),
    ("X-Forwarded-Port", "70000"), ("X-Forwarded-Prefix", "api"),
    ("X-Forwarded-Prefix", "/a/../b"), ("X-Forwarded-Prefix", "/a?b"),
])
def test_bad_forwarder_values_are_ignored(serve_on, field, value):
    addr = serve_on(echo, forwarder_headers=ALL_FORWARDER)
    plain = ask(addr)
    env = ask(addr, [(field, value)])
    for k in ("HTTP_HOST", "SERVER_NAME", "SERVER_PORT", "SCRIPT_NAME"):
        assert env[k] == plain[k], k


# ---- IPv6 and unix-socket peers -----------------------------------------------------------


def test_ipv6_peer(serve_on):
    addr = serve_on(echo, where="::1")                     # ::1 is in the default
    env = ask(addr, [("X-Forwarded-For", "2001:db8::7"), ("X-Forwarded-Ssl", "on")])
    assert env["REMOTE_ADDR"] == "2001:db8::7" and env["wsgi.url_scheme"] == "https"
    addr = serve_on(echo, where="::1", forwarded_allow_ips=["127.0.0.1"])
    assert ask(addr, [("X-Forwarded-For", "2001:db8::7")])["REMOTE_ADDR"] == "::1"
    addr = serve_on(echo, where="::1", forwarded_allow_ips=["::/127"])
    assert ask(addr, [("X-Forwarded-For", "2001:db8::7")])["REMOTE_ADDR"] == "2001:db8::7"


def test_unix_socket_peer_trusted_only_when_said(serve_on):
    path = serve_on(echo, where="unix")
    env = ask(path, [("X-Forwarded-For", "192.0.2.5"), ("X-Forwarded-Proto", "https")])
    assert env["REMOTE_ADDR"] == "" and env["wsgi.url_scheme"] == "http"
    for allow in (["unix"], ["*"]):
        path = serve_on(echo, where="unix", forwarded_allow_ips=allow)
        env = ask(path, [("X-Forwarded-For", "192.0.2.5"), ("X-Forwarded-Proto", "https")])
        assert env["REMOTE_ADDR"] == "192.0.2.5" and env["wsgi.url_scheme"] == "https"


def test_access_log_names_the_client(serve_on, tmp_path):
    """The access log's %(h)s is REMOTE_ADDR: the client, not the proxy."""
    log = tmp_path / "access.log"
    addr = serve_on(echo, access_logfile=str(log), access_log_format="%(h)s %(r)s")
    ask(addr, [("X-Forwarded-For", "203.0.113.7")], path="/logged")

    def lines():
        return log.read_text().splitlines() if log.exists() else []
    deadline = time.monotonic() + 10          # the line follows the response
    while not lines() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lines() == ["203.0.113.7 GET /logged HTTP/1.1"]


def test_garbage_values_never_fail_a_request(serve_on):
    """Random values built from the characters the parsers care about, on
    one kept-alive connection: every request answered 200, REMOTE_ADDR
    always an address, the scheme http or https (under ASan too:
    test_http_asan.py runs this file)."""
    import ipaddress
    import random

    rnd = random.Random(24)
    alphabet = '[]:";,=_ .\t0123456789abcdefABCDEFforFORprotohsunknwx/\\?#-'
    names = ["X-Forwarded-For", "Forwarded", "X-Forwarded-Proto", "X-Forwarded-Ssl",
             "X-Forwarded-Host", "X-Forwarded-Port", "X-Forwarded-Prefix"]
    seeds = ['for="[2001:db8::1]:80";proto=https', "for=192.0.2.1", "203.0.113.9, 10.0.0.1",
             "/api/", "shop.example:443", "https", "_hidden"]
    addr = serve_on(echo, forwarded_allow_ips=["127.0.0.1", "10.0.0.0/8"],
                    forwarder_headers=ALL_FORWARDER)
    with connect(addr) as c:
        for _ in range(400):
            fields = []
            for _ in range(rnd.randint(1, 4)):
                value = rnd.choice(seeds) if rnd.random() < 0.3 else ""
                value = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 40))) + value
                if rnd.random() < 0.5 and value:         # mutate a valid-looking one
                    i = rnd.randrange(len(value))
                    value = value[:i] + rnd.choice(alphabet) + value[i + 1:]
                fields.append((rnd.choice(names), value.strip() or "x"))
            c.sendall(request(headers=fields))
            status, body = read_response(c)
            assert status == 200, (fields, body)
            env = json.loads(body)
            ipaddress.ip_address(env["REMOTE_ADDR"])
            assert env["wsgi.url_scheme"] in ("http", "https")
            assert env["SERVER_PORT"].isdigit(), fields
