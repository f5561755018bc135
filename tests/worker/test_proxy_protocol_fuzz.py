"""The PROXY protocol parser (worker/native/parse/proxy_proto.c) against a strict
Python reference (proxy_reference.py) on generated headers, mutated ones
and garbage: for every input and every prefix of it, both give the same
verdict (a header, more bytes needed, refused), the same header length
(what is left for the protocol above), the same addresses and the same
TLV values, in every mode. Under AddressSanitizer + UBSan through
test_proxy_protocol_asan.py; bench/fuzz_proxy.sh runs it for longer
(FUZZ_PROXY_EXAMPLES examples per test, 300 here unless set)."""
from __future__ import annotations

import ipaddress
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import proxy_reference as ref
from sockherd.worker._http import proxy_parse, proxy_signature

pytestmark = pytest.mark.timeout(int(os.environ.get("FUZZ_PROXY_TIMEOUT", "300")))

EXAMPLES = int(os.environ.get("FUZZ_PROXY_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
MODES = ("v1", "v2", "auto")


def engine(data: bytes, mode: str) -> ref.Verdict:
    used, info = proxy_parse(data, mode)
    if used > 0:
        return ref.Verdict("ok", used, ref.normalized(info))
    return ref.Verdict("more", 0, None) if used == 0 else ref.Verdict("error", 0, info)


def agree(data: bytes) -> None:
    """The oracle: every mode, every prefix (a header split anywhere across
    reads must give one verdict), the signature check too."""
    for mode in MODES:
        for cut in sorted({*range(0, min(len(data), 40) + 1), *range(40, len(data) + 1, 7),
                           len(data)}):
            piece = data[:cut]
            want, got = ref.parse(piece, mode), engine(piece, mode)
            assert got.kind == want.kind, (mode, piece, got, want)
            if want.kind == "ok":
                assert (got.used, got.info) == (want.used, want.info), (mode, piece, got, want)
    for cut in range(0, min(len(data), 14) + 1):
        assert proxy_signature(data[:cut]) == ref.signature(data[:cut]), data[:cut]


# ---- generated headers ------------------------------------------------------------------

ipv4 = st.builds(ipaddress.IPv4Address, st.integers(0, 2**32 - 1))
ipv6 = st.builds(ipaddress.IPv6Address, st.integers(0, 2**128 - 1))
port = st.integers(0, 65535)
tlv_value = st.binary(max_size=12)


def v6_text(a: ipaddress.IPv6Address, style: int) -> str:
    """The text forms a sender may use: compressed, exploded, mapped v4."""
    if style == 1:
        return a.exploded
    if style == 2 and a.ipv4_mapped is None:
        return "::ffff:" + str(ipaddress.IPv4Address(int(a) & 0xFFFFFFFF))
    return a.compressed


# text a sender gets wrong: where inet_pton and ipaddress could disagree
# with each other or with the spec's strictness
ODD_PORTS = ["0", "00", "01", "0080", "65535", "65536", "99999", "123456", "-1", "+1", " 1", "1 ",
             "1.0", "0x50", ""]
ODD_V4 = ["01.2.3.4", "1.2.3.04", "1.2.3", "1.2.3.4.5", "256.0.0.1", "0x1.2.3.4", "1.2.3.4 ",
          "1..2.3", "0.0.0.0", "255.255.255.255", "1.2.3.-4", "١.2.3.4", ""]
ODD_V6 = ["::", "::1", "1::", "::ffff:1.2.3.4", "::ffff:01.2.3.4", "1::2:3:4:5:6:7",
          "1:2:3:4:5:6:7::", "1:2:3:4:5:6:7:8:9", "1:2:3:4:5:6:7:8", ":::", "1:::2", "::1%1",
          "fe80::1%eth0", "[::1]", "12345::", "::fffff", "1:2:3:4:5:6:1.2.3.4",
          "1:2:3:4:5:6:7:1.2.3.4", "::1.2.3.4", "0:0::0:0", "ABCD::EF", "1.2.3.4", ""]


@st.composite
def v1_header(draw) -> bytes:
    kind = draw(st.sampled_from(["TCP4", "TCP6", "UNKNOWN"]))
    if kind == "UNKNOWN":
        tail = draw(st.sampled_from([b"", b" ", b" 1.2.3.4 5.6.7.8 1 2", b" junk\x00\xff"]))
        return b"PROXY UNKNOWN" + tail + b"\r\n"
    if kind == "TCP4":
        fields = [str(draw(ipv4)), str(draw(ipv4))]
        odd_addresses = ODD_V4
    else:
        style = draw(st.integers(0, 2))
        fields = [v6_text(draw(ipv6), style), v6_text(draw(ipv6), style)]
        odd_addresses = ODD_V6
    fields += [str(draw(port)), str(draw(port))]
    # at most one field odd: a second error would hide the first one's
    odd = draw(st.sampled_from([None, None, 0, 1, 2, 3, "family"]))
    if odd == "family":                  # both addresses of the other family
        fields[:2] = [str(draw(ipv6)), str(draw(ipv6))] if kind == "TCP4" else \
            [str(draw(ipv4)), str(draw(ipv4))]
    elif odd is not None:
        fields[odd] = draw(st.sampled_from(odd_addresses if odd < 2 else ODD_PORTS))
    return f"PROXY {kind} {' '.join(fields)}\r\n".encode()


@st.composite
def tlvs(draw) -> bytes:
    out = b""
    for kind in draw(st.lists(st.sampled_from([0x01, 0x02, 0x04, 0x05, 0x20, 0x30, 0xE0]),
                              max_size=4)):
        if kind == 0x20:
            subs = {name: draw(st.text("abcdefgh-_.0123", max_size=10))
                    for name in draw(st.lists(st.sampled_from(list(ref.SSL_SUB.values())),
                                              unique=True, max_size=3))}
            out += ref.ssl_tlv(draw(st.integers(0, 7)), draw(st.integers(0, 2**32 - 1)), **subs)
        else:
            out += ref.tlv(kind, draw(tlv_value))
    return out


@st.composite
def v2_header(draw) -> bytes:
    fam = draw(st.sampled_from([0x11, 0x21, 0x31, 0x00]))
    command = draw(st.sampled_from([1, 1, 1, 0]))
    if fam == 0x11:
        addresses = draw(ipv4).packed + draw(ipv4).packed + draw(st.binary(min_size=4, max_size=4))
    elif fam == 0x21:
        addresses = draw(ipv6).packed + draw(ipv6).packed + draw(st.binary(min_size=4, max_size=4))
    elif fam == 0x31:
        addresses = b"".join(draw(st.sampled_from([b"/run/a.sock", b"", b"x" * 108])).ljust(108, b"\0")
                             for _ in range(2))
    else:
        addresses = b""
    return ref.v2(addresses=addresses, fam=fam, command=command, tlvs=draw(tlvs()),
                  crc=draw(st.booleans()))


@st.composite
def mutated(draw, header) -> bytes:
    """A header, then 0-3 mutations (a byte changed, removed, inserted,
    the length field rewritten), then what a client sends after it."""
    data = bytearray(draw(header))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2, 3]))):
        what = draw(st.sampled_from(["set", "del", "ins", "len"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if what == "set" and data:
            data[at] = draw(st.sampled_from([0, 0x0A, 0x0D, 0x20, 0x21, 0x3A, 0x30, 0xFF,
                                             draw(st.integers(0, 255))]))
        elif what == "del" and data:
            del data[at]
        elif what == "ins":
            data.insert(at, draw(st.integers(0, 255)))
        elif what == "len" and len(data) >= 16 and data[:12] == ref.V2_SIG:
            data[14:16] = draw(st.integers(0, 2100)).to_bytes(2, "big")
    return bytes(data) + draw(st.sampled_from([b"", b"GET / HTTP/1.1\r\n\r\n", b"\r\n\r\n",
                                               b"PROXY TCP4 1.1.1.1 2.2.2.2 1 2\r\n"]))


@FUZZ
@given(mutated(v1_header()))
def test_v1_headers_agree_with_the_reference(data):
    agree(data)


@FUZZ
@given(mutated(v2_header()))
def test_v2_headers_agree_with_the_reference(data):
    agree(data)


@FUZZ
@given(st.one_of(st.binary(max_size=200),
                 st.binary(max_size=120).map(lambda b: b"PROXY " + b),
                 st.binary(max_size=300).map(lambda b: ref.V2_SIG + b)))
def test_garbage_agrees_with_the_reference(data):
    agree(data)


@pytest.mark.parametrize("data", [
    ref.v1("::ffff:1.2.3.4", "::1", proto="TCP6"),      # v4-mapped: text forms differ
    ref.v1("1.2.3.4", "5.6.7.8", 0, 65535),
    b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",            # a leading zero
    b"PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n",
    b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n",            # a zone
    b"PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n",             # v4 under TCP6
    b"PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n",            # two spaces
    b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n",
    b"PROXY UNKNOWN\r\n", b"PROXY UNKNOWNX\r\n", b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",
    b"PROXY " + b"x" * 99 + b"\r\n", b"PROXY " + b"x" * 100 + b"\r\n",
    ref.v2(crc=True), ref.v2(tlvs=ref.tlv(0x01, b"h2") + ref.tlv(0x01, b"h2")),
    ref.v2(tlvs=ref.tlv(0x05, b"u" * 129)), ref.v2(fam=0x12), ref.v2(command=2),
    ref.v2(tlvs=ref.ssl_tlv(cn="c", version="TLSv1.3")[:-1]),
])
def test_edge_cases_agree_with_the_reference(data):
    agree(data)
