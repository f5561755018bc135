"""forwarded_allow_ips and proxy_allow_from are the same kind of list
(addresses, CIDR networks, `*`, `unix`; comma-separated items) and are
read and matched one way (worker/netmatch.py, worker/native/parse/netmatch.c).

Findings reproduced (the duplicates review: each setting had its own
parser and its own native matcher, and they had drifted):
 - proxy_allow_from refused `unix:` and `UNIX`, which forwarded_allow_ips
   takes;
 - proxy_allow_from kept a v4-mapped entry (`::ffff:127.0.0.1`) as IPv6,
   while a peer is compared as IPv4 (a dual-stack socket's v4-mapped
   peer too): the peer it names could never send a PROXY header, to the
   engine or to the stream interface.
"""
from __future__ import annotations

import pytest

import proxy_reference as ref
from sockherd.master import settings as S
from sockherd.worker import forwarded
from sockherd.worker.proxy import Policy
from test_proxy_protocol_http import GET, body_of, environ_app, exchange

pytestmark = pytest.mark.timeout(60)

ITEMS = ["10.0.0.1, 192.168.0.0/16", "UNIX:", "::ffff:10.0.0.0/104", "2001:db8::/32"]


def test_the_same_items_mean_the_same_peers():
    fwd = forwarded.parse(ITEMS, [], [])
    proxy = Policy("v1", ITEMS).allow
    assert (fwd.nets, fwd.all, fwd.unix) == (proxy.nets, proxy.all, proxy.unix)
    assert [str(n) for n in proxy.nets] == ["10.0.0.1/32", "192.168.0.0/16", "10.0.0.0/8",
                                            "2001:db8::/32"]
    assert proxy.unix and not proxy.all
    assert Policy("v1", ["*"]).allow.all


@pytest.mark.parametrize("peer,allowed", [
    (("10.1.2.3", 80), True),               # in the v4-mapped entry, as IPv4
    (("::ffff:10.1.2.3", 80, 0, 0), True),  # a dual-stack socket's v4 peer
    (("192.168.7.7", 1), True),
    (("2001:db8::1%1", 1, 0, 1), True),
    (("11.0.0.1", 1), False),
    ("", True),                             # a unix-socket peer
])
def test_the_stream_interface_matches_as_the_engine_does(peer, allowed):
    assert Policy("v1", ITEMS).allowed(peer) is allowed


@pytest.mark.parametrize("key,value", [
    ("SOCKHERD_FORWARDED_ALLOW_IPS", "10.0.0.1,localhost"),
    ("SOCKHERD_PROXY_ALLOW_FROM", "10.0.0.1,localhost"),
])
def test_a_bad_item_is_named_with_its_setting(key, value):
    setting = key.removeprefix("SOCKHERD_").lower()
    with pytest.raises(S.SettingsError) as e:
        S.resolve({}, env={key: value})
    assert str(e.value) == f"{setting}: 'localhost' is not an address, a CIDR network, '*' or 'unix'"


def test_unix_is_spelled_alike_in_both():
    s = S.resolve({}, env={"SOCKHERD_PROXY_ALLOW_FROM": "UNIX:",
                           "SOCKHERD_FORWARDED_ALLOW_IPS": "UNIX:"})
    assert Policy("v1", s.proxy_allow_from).allow.unix
    assert forwarded.parse(s.forwarded_allow_ips, [], []).unix


def test_a_v4_mapped_entry_lets_its_v4_peer_send_a_header(serve_wsgi):
    _, a = serve_wsgi(environ_app, proxy_protocol="v1", proxy_allow_from=["::ffff:127.0.0.1"])
    seen = body_of(exchange(a, ref.v1("192.0.2.7", "127.0.0.1", 5555, 80) + GET))
    assert (seen["REMOTE_ADDR"], seen["REMOTE_PORT"]) == ("192.0.2.7", "5555")


def test_every_peer_may_send_a_header_with_a_star(serve_wsgi):
    _, a = serve_wsgi(environ_app, proxy_protocol="v1", proxy_allow_from=["*"])
    seen = body_of(exchange(a, ref.v1("192.0.2.8", "127.0.0.1", 6, 80) + GET))
    assert (seen["REMOTE_ADDR"], seen["REMOTE_PORT"]) == ("192.0.2.8", "6")
