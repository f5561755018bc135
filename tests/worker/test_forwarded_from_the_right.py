"""Forwarded (RFC 7239) is read from the right (issue 35 point 15): each
proxy appends its element after what it received, so the elements right
of the first untrusted hop are the trusted proxies' and everything left of
it is the client's own. A quoted-pair, more than 32 elements or a
parameter twice in the client's part used to make the whole header be
discarded, the element the trusted proxy appended with it: the client
then appeared as the proxy (127.0.0.1) or as its own X-Forwarded-For, and
its X-Forwarded-Proto set the scheme. Now what is left of the hop the walk
stops at is never read.

Shown on a real worker Loop over a real fdcore Table (test_forwarded_
headers.py's serve_on), WSGI and ASGI, with the test as the trusted proxy
(127.0.0.1) writing the header two ways: a Forwarded field of its own
after the client's, and nginx's common append recipe
`proxy_set_header Forwarded "$http_forwarded, for=$remote_addr;proto=$scheme"`,
which makes one value of the client's part and the proxy's. Under ASan
too (test_http_asan.py's "responses" part)."""
from __future__ import annotations

import logging

import pytest

from test_forwarded_asgi import ask as ask_asgi
from test_forwarded_asgi import echo_scope
from test_forwarded_headers import ask, echo
from test_forwarded_headers import serve_on  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(60)

CLIENT = "203.0.113.9"                 # who the proxy received from
# what the client itself sends: a poisoned Forwarded, and the other
# fields it would like believed
POISON = {
    "quoted-pair": r'for="\"198.51.100.66"',
    "escaped quote hiding a comma": r'for="x\", for=198.51.100.66"',
    "unterminated quote": 'for="198.51.100.66',
    "41 elements": ",".join(["for=198.51.100.66"] * 41),
    "parameter twice": "for=198.51.100.66;for=198.51.100.67",
    "garbage": 'for 198.51.100.66;;"=,=',
}
CLAIMS = [("X-Forwarded-For", "198.51.100.66"), ("X-Forwarded-Proto", "https")]
PROXY_ELEMENT = f"for={CLIENT};proto=http"


def separate_field(poison):
    return [("Forwarded", poison)] + CLAIMS + [("Forwarded", PROXY_ELEMENT)]


def nginx_recipe(poison):
    return [("Forwarded", f"{poison}, {PROXY_ELEMENT}")] + CLAIMS


@pytest.mark.parametrize("how", [separate_field, nginx_recipe])
@pytest.mark.parametrize("poison", sorted(POISON))
def test_the_clients_part_cannot_undo_the_proxys_element(serve_on, how, poison):
    addr = serve_on(echo)
    env = ask(addr, how(POISON[poison]))
    assert (env["REMOTE_ADDR"], env["wsgi.url_scheme"], env["HTTPS"]) == (CLIENT, "http", None)


@pytest.mark.parametrize("how", [separate_field, nginx_recipe])
@pytest.mark.parametrize("poison", sorted(POISON))
def test_the_same_in_the_asgi_scope(serve_on, how, poison):
    addr = serve_on(echo_scope, asgi=True)
    scope = ask_asgi(addr, how(POISON[poison]))
    assert (scope["client"], scope["scheme"]) == ([CLIENT, 0], "http")


def test_trusted_hops_right_of_a_malformed_part_still_count(serve_on):
    """Two trusted proxies (127.0.0.1, then 10.0.0.5) each appended: the
    walk passes 10.0.0.5 and stops at the client, whatever is left."""
    addr = serve_on(echo, forwarded_allow_ips=["127.0.0.1", "10.0.0.0/8"])
    env = ask(addr, [("Forwarded", r'for="\"x", for=192.0.2.7;proto=https, for=10.0.0.5')])
    assert (env["REMOTE_ADDR"], env["wsgi.url_scheme"]) == ("192.0.2.7", "https")


def test_a_malformed_element_reached_ends_the_chain(serve_on, caplog):
    """Every hop right of a malformed element trusted: the list ends there
    for us, the leftmost good element names the client (as when every hop
    is trusted), and the malformed part is logged."""
    caplog.set_level(logging.DEBUG, logger="sockherd.forwarded")
    addr = serve_on(echo, forwarded_allow_ips=["127.0.0.1", "10.0.0.0/8"])
    env = ask(addr, [("Forwarded", r'for="\"x", for=10.0.0.7;proto=https, for=10.0.0.5')])
    assert (env["REMOTE_ADDR"], env["wsgi.url_scheme"]) == ("10.0.0.7", "https")
    assert "ignored a malformed Forwarded" in caplog.text
    # the proxy's own element malformed: nothing from Forwarded at all
    env = ask(addr, [("Forwarded", "for=192.0.2.1;for=192.0.2.2"),
                     ("X-Forwarded-For", "192.0.2.9")])
    assert env["REMOTE_ADDR"] == "192.0.2.9"


@pytest.mark.parametrize("value,client,scheme", [
    ('for="[2001:db8::1]:80";proto=https', "2001:db8::1", "https"),
    ('proto=https;for="192.0.2.1,x"', "127.0.0.1", "http"),    # a bad for=: all ignored
    ("for=192.0.2.1 ; proto=https ,", "192.0.2.1", "https"),
    ("for=192.0.2.1;;proto=https;by=_x;ext=1", "192.0.2.1", "https"),
    ("for=192.0.2.1 proto=https", "127.0.0.1", "http"),      # pairs need a ';'
    ("for=192.0.2.1;proto=", "192.0.2.1", "http"),          # a bad proto= alone ignored
])
def test_element_syntax_read_backwards(serve_on, value, client, scheme):
    addr = serve_on(echo)
    env = ask(addr, [("Forwarded", value)])
    assert (env["REMOTE_ADDR"], env["wsgi.url_scheme"]) == (client, scheme)
