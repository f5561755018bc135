"""A strict reference parser of the PROXY protocol, versions 1 and 2, written
from HAProxy's doc/proxy-protocol.txt and sockherd's stated policy, with no
code in common with worker/native/parse/proxy_proto.c (addresses through Python's
ipaddress, not inet_pton): the oracle of test_proxy_protocol_fuzz.py and
bench/fuzz_proxy.sh.

parse(data, mode) -> Verdict: ('more', 0, None) while data is a valid
prefix as far as the incremental rules look, ('error', 0, reason), or
('ok', n, info) with n the header's length and info the dict the engine
exposes (version, local, src, dst, alpn, authority, unique_id, ssl).

The rules (the policy both parsers state):
  mode      v1, v2, or auto (the first byte: 0x0D is v2, anything else v1)
  v1        "PROXY " checked byte by byte; then the line up to the first LF
            within 107 bytes (none in 107 bytes: too long; fewer than 107
            bytes and none: more); the byte before the LF is CR, no other
            CR in the line; "PROXY UNKNOWN" alone or followed by a space
            and anything (local: the socket's addresses); else "PROXY"
            SP ("TCP4" | "TCP6") SP src SP dst SP sport SP dport, exactly
            single spaces, addresses of that family (dotted quad without
            leading zeros; IPv6 text without a zone), ports 0..65535 in
            decimal without leading zeros
  v2        the 12-byte signature byte by byte; with 16 bytes: version 2,
            command LOCAL (0) or PROXY (1), len <= 2048, for PROXY a family
            byte of 0x00, 0x11, 0x21 or 0x31; then all of 16 + len bytes;
            LOCAL ignores the rest; PROXY needs len >= 12 / 36 / 216 for
            INET / INET6 / UNIX (0 for UNSPEC, which is local), then TLVs
            that end exactly at the header's end: ALPN, AUTHORITY,
            UNIQUE_ID (<= 128 bytes), CRC32C (4 bytes, over the header with
            its value zeroed, must match), SSL (>= 5 bytes: client, verify,
            sub-TLVs VERSION, CN, CIPHER, SIG_ALG, KEY_ALG, that end
            exactly at its end); a known type twice is malformed; others
            (NOOP included) skipped
"""
from __future__ import annotations

import ipaddress
import os
from typing import Any, NamedTuple

V2_SIG = b"\r\n\r\n\x00\r\nQUIT\n"
V1_SIG = b"PROXY "
V1_MAX = 107
V2_MAX_LEN = 2048


class Verdict(NamedTuple):
    kind: str            # 'ok', 'more', 'error'
    used: int
    info: Any


def more() -> Verdict:
    return Verdict("more", 0, None)


def error(reason: str) -> Verdict:
    return Verdict("error", 0, reason)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def _prefix_of(data: bytes, sig: bytes) -> str:
    """'yes' data starts with sig, 'prefix' it may still, 'no'."""
    if data[:len(sig)] != sig[:len(data)]:
        return "no"
    return "yes" if len(data) >= len(sig) else "prefix"


def signature(data: bytes) -> int:
    """1, 0, -1 as proxy_signature: a header's signature, none, maybe."""
    a, b = _prefix_of(data, V1_SIG), _prefix_of(data, V2_SIG)
    if "yes" in (a, b):
        return 1
    return -1 if "prefix" in (a, b) else 0


# ---- version 1 -------------------------------------------------------------------

def _port(text: bytes) -> int | None:
    if not 1 <= len(text) <= 5 or not all(48 <= c <= 57 for c in text):
        return None
    if len(text) > 1 and text[:1] == b"0":
        return None
    value = int(text)
    return value if value <= 65535 else None


def _v1_address(text: bytes, version: int):
    try:
        s = text.decode("ascii")
    except UnicodeDecodeError:
        return None
    if "%" in s or not s or s != s.strip():
        return None                  # a zone, or whitespace ipaddress would not see
    try:
        return ipaddress.IPv4Address(s) if version == 4 else ipaddress.IPv6Address(s)
    except ValueError:
        return None


def _v1(data: bytes) -> Verdict:
    sig = _prefix_of(data, V1_SIG)
    if sig == "no":
        return error("missing")
    if sig == "prefix":
        return more()
    lf = data.find(b"\n", 0, V1_MAX)
    if lf < 0:
        return error("v1 too long") if len(data) >= V1_MAX else more()
    line = data[:lf]
    if not line.endswith(b"\r") or b"\r" in line[:-1]:
        return error("v1 syntax")
    rest = line[len(V1_SIG):-1]
    if rest == b"UNKNOWN" or rest.startswith(b"UNKNOWN "):
        return Verdict("ok", lf + 1, {"version": 1, "local": True})
    fields = rest.split(b" ")
    if len(fields) != 5 or fields[0] not in (b"TCP4", b"TCP6") or not all(fields):
        return error("v1 syntax")
    version = 4 if fields[0] == b"TCP4" else 6
    src, dst = _v1_address(fields[1], version), _v1_address(fields[2], version)
    if src is None or dst is None:
        return error("v1 address")
    sport, dport = _port(fields[3]), _port(fields[4])
    if sport is None or dport is None:
        return error("v1 port")
    return Verdict("ok", lf + 1, {"version": 1, "local": False, "src": (src, sport),
                                  "dst": (dst, dport)})


# ---- version 2 -------------------------------------------------------------------

def _tlvs(block: bytes):
    """[(type, value)] of a block that TLVs fill exactly, or None."""
    out, i = [], 0
    while i < len(block):
        if len(block) - i < 3:
            return None
        n = int.from_bytes(block[i + 1:i + 3], "big")
        if len(block) - i - 3 < n:
            return None
        out.append((block[i], block[i + 3:i + 3 + n], i + 3))
        i += 3 + n
    return out


SSL_SUB = {0x21: "version", 0x22: "cn", 0x23: "cipher", 0x24: "sig_alg", 0x25: "key_alg"}


def _ssl(value: bytes):
    if len(value) < 5:
        return None
    subs = _tlvs(value[5:])
    if subs is None:
        return None
    ssl = {"client": value[0], "verify": int.from_bytes(value[1:5], "big")}
    for kind, v, _ in subs:
        if kind in SSL_SUB:
            if SSL_SUB[kind] in ssl:
                return None
            ssl[SSL_SUB[kind]] = v.decode("latin-1")
    return ssl


def _path(raw: bytes) -> str:
    return os.fsdecode(raw.split(b"\0", 1)[0])


def _v2(data: bytes) -> Verdict:
    if _prefix_of(data, V2_SIG) == "no":
        return error("missing")
    if len(data) < 16:
        return more()
    if data[12] >> 4 != 2:
        return error("v2 version")
    command = data[12] & 0x0F
    if command not in (0, 1):
        return error("v2 command")
    length = int.from_bytes(data[14:16], "big")
    if length > V2_MAX_LEN:
        return error("v2 too long")
    fam = data[13]
    if command == 1 and fam not in (0x00, 0x11, 0x21, 0x31):
        return error("v2 family")
    total = 16 + length
    if len(data) < total:
        return more()
    if command == 0:
        return Verdict("ok", total, {"version": 2, "local": True})
    need = {0x00: 0, 0x11: 12, 0x21: 36, 0x31: 216}[fam]
    if length < need:
        return error("v2 short")
    a = data[16:16 + need]
    info: dict[str, Any] = {"version": 2, "local": fam == 0x00}
    if fam == 0x11:
        info["src"] = (ipaddress.IPv4Address(a[0:4]), int.from_bytes(a[8:10], "big"))
        info["dst"] = (ipaddress.IPv4Address(a[4:8]), int.from_bytes(a[10:12], "big"))
    elif fam == 0x21:
        info["src"] = (ipaddress.IPv6Address(a[0:16]), int.from_bytes(a[32:34], "big"))
        info["dst"] = (ipaddress.IPv6Address(a[16:32]), int.from_bytes(a[34:36], "big"))
    elif fam == 0x31:
        info["src"], info["dst"] = _path(a[:108]), _path(a[108:216])
    tlvs = _tlvs(data[16 + need:total])
    if tlvs is None:
        return error("v2 tlv")
    crc_at = None
    for kind, value, at in tlvs:
        name = {0x01: "alpn", 0x02: "authority", 0x05: "unique_id", 0x20: "ssl"}.get(kind)
        if kind == 0x03:
            if len(value) != 4 or crc_at is not None:
                return error("v2 tlv")
            crc_at = 16 + need + at
            continue
        if name is None:
            continue
        if name in info or (kind == 0x05 and len(value) > 128):
            return error("v2 tlv")
        if kind == 0x20:
            ssl = _ssl(value)
            if ssl is None:
                return error("v2 tlv")
            info["ssl"] = ssl
        else:
            info[name] = value if kind == 0x05 else value.decode("latin-1")
    if crc_at is not None:
        header = bytearray(data[:total])
        want = int.from_bytes(header[crc_at:crc_at + 4], "big")
        header[crc_at:crc_at + 4] = b"\0\0\0\0"
        if crc32c(bytes(header)) != want:
            return error("v2 crc")
    return Verdict("ok", total, info)


def parse(data: bytes, mode: str) -> Verdict:
    if not data:
        return more()
    if mode == "auto":
        mode = "v2" if data[0] == 0x0D else "v1"
    return _v2(data) if mode == "v2" else _v1(data)


def normalized(info: dict | None) -> dict | None:
    """The engine's info in the reference's shape: addresses as ipaddress
    objects (the text forms of the two may differ: ::ffff:a.b.c.d)."""
    if info is None:
        return None
    out = dict(info)
    for key in ("src", "dst"):
        if isinstance(out.get(key), tuple):
            out[key] = (ipaddress.ip_address(out[key][0]), out[key][1])
    return out


# ---- headers, for tests ------------------------------------------------------------------

def v1(src: str = "192.0.2.7", dst: str = "127.0.0.1", sport: int = 5555, dport: int = 80,
       proto: str | None = None) -> bytes:
    proto = proto or ("TCP6" if ":" in src else "TCP4")
    return f"PROXY {proto} {src} {dst} {sport} {dport}\r\n".encode()


def tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + len(value).to_bytes(2, "big") + value


def v2(src: str = "192.0.2.7", dst: str = "127.0.0.1", sport: int = 5555, dport: int = 80,
       tlvs: bytes = b"", command: int = 1, fam: int | None = None, crc: bool = False,
       addresses: bytes | None = None) -> bytes:
    """A v2 header (addresses: a raw address block instead of src/dst)."""
    if addresses is None:
        s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
        addresses = s.packed + d.packed + sport.to_bytes(2, "big") + dport.to_bytes(2, "big")
        if fam is None:
            fam = 0x11 if s.version == 4 else 0x21
    body = addresses + tlvs + (tlv(0x03, b"\0\0\0\0") if crc else b"")
    head = V2_SIG + bytes([0x20 | command, fam if fam is not None else 0x11]) + \
        len(body).to_bytes(2, "big")
    out = bytearray(head + body)
    if crc:
        out[-4:] = crc32c(bytes(out)).to_bytes(4, "big")
    return bytes(out)


def ssl_tlv(client: int = 1, verify: int = 0, **subs: str) -> bytes:
    codes = {v: k for k, v in SSL_SUB.items()}
    value = bytes([client]) + verify.to_bytes(4, "big") + b"".join(
        tlv(codes[name], text.encode()) for name, text in subs.items())
    return tlv(0x20, value)
