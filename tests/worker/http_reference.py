"""A strict reference framer for HTTP/1.1 requests, written from RFC 9112's
ABNF (and RFC 9110's field syntax) and sockherd's stated policy, with no
code in common with llhttp or worker/native: the oracle of
test_http_framing_fuzz.py and bench/gunicorn_corpus.py.

It reads a whole byte stream (what a client sent before half-closing) and
says how a strict server frames it: the complete requests, in order, then
how the stream ends: 'done' (nothing left, or the last request asked to
close), 'partial' (the stream stops inside a message: a server may answer
4xx or just close), or 'reject' (the next message is malformed: a server
must refuse it, 4xx/5xx or close, and dispatch nothing from there on).

What it accepts (CRLF only, everywhere):
  request-line  = method SP request-target SP HTTP-version CRLF
                  (method a token; target origin-form, or "*" for OPTIONS;
                  HTTP/1.0 or HTTP/1.1, other versions refused)
  field-line    = field-name ":" OWS field-value OWS CRLF  (no obs-fold)
  unknown methods refused (501); empty lines (CRLF) before a request-line are skipped (RFC 9112 §2.2)
  framing       = Transfer-Encoding: chunked (exactly that coding, HTTP/1.1,
                  no Content-Length beside it), else one Content-Length
                  (1*DIGIT), else no body
  chunked-body  = *chunk last-chunk trailer-section CRLF, chunk extensions
                  with BWS, token or quoted-string values (RFC 9112 §7.1.1)
  policy        = exactly one valid Host on HTTP/1.1 (at most one on 1.0),
                  no Content-Length / Transfer-Encoding / Host in trailers,
                  HTTP/1.0 closes unless Connection: keep-alive, HTTP/1.1
                  keeps alive unless Connection: close.
Size limits are not modelled: callers keep their inputs well under them."""
from __future__ import annotations

import re
from typing import NamedTuple

DIGIT = frozenset(b"0123456789")
ALPHA = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
HEXDIG = DIGIT | frozenset(b"abcdefABCDEF")
TCHAR = ALPHA | DIGIT | frozenset(b"!#$%&'*+-.^_`|~")
UNRESERVED = ALPHA | DIGIT | frozenset(b"-._~")
SUB_DELIMS = frozenset(b"!$&'()*+,;=")
PCHAR = UNRESERVED | SUB_DELIMS | frozenset(b":@")
OBS_TEXT = frozenset(range(0x80, 0x100))
FIELD_CHAR = frozenset(range(0x21, 0x7F)) | OBS_TEXT | frozenset(b" \t")
QDTEXT = frozenset(b"\t !") | frozenset(range(0x23, 0x5C)) | frozenset(range(0x5D, 0x7F)) | OBS_TEXT
WS = b" \t"
# the registered methods the engine knows (others get 501, RFC 9110 §9.1)
METHODS = frozenset(b"""DELETE GET HEAD POST PUT CONNECT OPTIONS TRACE COPY LOCK MKCOL MOVE PROPFIND
PROPPATCH SEARCH UNLOCK BIND REBIND UNBIND ACL REPORT MKACTIVITY CHECKOUT MERGE M-SEARCH NOTIFY
SUBSCRIBE UNSUBSCRIBE PATCH PURGE MKCALENDAR LINK UNLINK SOURCE QUERY""".split())
VERSION = re.compile(rb"HTTP/[0-9]\.[0-9]\Z")


class Request(NamedTuple):
    method: bytes
    target: bytes
    version: bytes
    fields: list            # [(lower-case name, value)] in order
    body: bytes
    keep_alive: bool


class Framing(NamedTuple):
    requests: list          # [Request], the complete ones in order
    end: str                # 'done' | 'partial' | 'reject'
    reason: str             # why it was refused ('' unless end == 'reject')
    head_ok: bool           # refused in the body: its head alone was acceptable


class Reject(Exception):
    pass


class Partial(Exception):
    pass


def frame(data: bytes) -> Framing:
    """How a strict server frames data (see the module's docstring)."""
    out: list[Request] = []
    pos, head_ok = 0, False
    try:
        while True:
            while data.startswith(b"\r\n", pos):          # RFC 9112 §2.2
                pos += 2
            if pos == len(data):
                return Framing(out, "done", "", False)
            head_ok = False
            req, pos = _request(data, pos, out)
            out.append(req)
            if not req.keep_alive:
                return Framing(out, "done", "", False)
    except Partial:
        return Framing(out, "partial", "", False)
    except Reject as exc:
        return Framing(out, "reject", str(exc), bool(getattr(exc, "head_ok", False)))


def _line(data: bytes, pos: int, where: str, empty: str = "") -> tuple[bytes, int]:
    """The line at pos without its CRLF, and where the next one starts;
    `where` names the line in a refusal, `empty` an empty one (the end of
    a section) when that is a different place."""
    lf = data.find(b"\n", pos)
    if lf < 0:
        cr = data.find(b"\r", pos)
        if 0 <= cr < len(data) - 1:
            raise Reject(f"bare CR in {where}")
        raise Partial()
    if lf == pos or data[lf - 1] != 0x0D:
        raise Reject(f"bare LF ending {empty or where}" if data[pos:lf] in (b"", b"\r")
                     else f"bare LF ending {where}")
    content = data[pos:lf - 1]
    if b"\r" in content:
        raise Reject(f"bare CR in {where}")
    return content, lf + 1


def _request(data: bytes, pos: int, out: list) -> tuple[Request, int]:
    line, pos = _line(data, pos, "the request line", "an empty line before a request")
    parts = line.split(b" ")
    if len(parts) == 2 and parts[0] and parts[1]:
        raise Reject("request line without a version")
    if len(parts) != 3 or not all(parts):
        raise Reject("not exactly one SP between the request line's parts"
                     if len(parts) > 3 or (len(parts) == 3 and not all(parts))
                     else "malformed request line")
    method, target, version = parts
    if not set(method) <= TCHAR:
        raise Reject("method is not a token")
    if method not in METHODS:
        raise Reject("method not implemented (501)")
    if not VERSION.match(version):
        raise Reject("malformed HTTP-version")
    if version not in (b"HTTP/1.0", b"HTTP/1.1"):
        raise Reject("HTTP version not supported")
    _target(method, target)
    fields, count = [], 0
    while True:
        line, pos = _line(data, pos, "a field line", "the head")
        if not line:
            break
        fields.append(_field(line, "header"))
        count += 1
    chunked, length, keep = _framing(version, fields)
    head_end = pos
    try:
        if chunked:
            body, pos = _chunked(data, pos)
        else:
            if len(data) - pos < length:
                raise Partial()
            body, pos = data[pos:pos + length], pos + length
    except Reject as exc:
        exc.head_ok = True
        raise
    assert pos >= head_end
    return Request(method, target, version, fields, body, keep), pos


def _target(method: bytes, target: bytes) -> None:
    if target == b"*":
        if method != b"OPTIONS":
            raise Reject("asterisk-form target with a method other than OPTIONS")
        return
    if target.startswith(b"*"):
        raise Reject("a target starting with '*' other than '*'")
    if not target.startswith(b"/"):
        target = _absolute(target)
    path, _, query = target.partition(b"?")
    _pct(path, PCHAR | frozenset(b"/"), "target path")
    _pct(query, PCHAR | frozenset(b"/?"), "target query")


def _absolute(target: bytes) -> bytes:
    """absolute-form (RFC 9112 §3.2.2, which a server MUST accept): an http
    or https URI with a host and no userinfo (RFC 9110 §4.2, §4.2.4); gives
    its path-abempty and query ("/" for an empty path) to check as usual."""
    scheme, sep, rest = target.partition(b"://")
    if not sep:
        raise Reject("not an origin-form target")
    if scheme.lower() not in (b"http", b"https"):
        raise Reject("absolute-form target of a scheme other than http(s)")
    end = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
    authority, path = rest[:end], rest[end:]
    if not authority or authority.startswith(b":") or b"@" in authority:
        raise Reject("absolute-form target without a valid host")
    _host(authority)
    return path if path.startswith(b"/") else b"/" + path


def _pct(s: bytes, allowed: frozenset, where: str) -> None:
    i = 0
    while i < len(s):
        c = s[i]
        if c == 0x25:                                       # %HH
            if len(s) < i + 3 or not set(s[i + 1:i + 3]) <= HEXDIG:
                raise Reject(f"bad percent-encoding in {where}")
            i += 3
            continue
        if c not in allowed:
            raise Reject(f"byte {c:#04x} not allowed in {where}")
        i += 1


def _field(line: bytes, where: str) -> tuple[bytes, bytes]:
    if line[:1] in (b" ", b"\t"):
        raise Reject(f"obsolete line folding in a {where} field")
    name, colon, value = line.partition(b":")
    if colon and not name:
        raise Reject(f"empty {where} field name")
    if not colon or not set(name) <= TCHAR:
        raise Reject(f"malformed {where} field name")
    value = value.strip(WS)
    if not set(value) <= FIELD_CHAR:
        raise Reject(f"byte not allowed in a {where} field value")
    return name.lower(), value


def _values(fields: list, name: bytes) -> list[bytes]:
    return [v for n, v in fields if n == name]


def _framing(version: bytes, fields: list) -> tuple[bool, int, bool]:
    """(chunked, content length, keep-alive) of a head, or Reject."""
    hosts = _values(fields, b"host")
    if len(hosts) > 1 or (version == b"HTTP/1.1" and not hosts):
        raise Reject("not exactly one Host")
    if hosts:
        _host(hosts[0])
    te, cl = _values(fields, b"transfer-encoding"), _values(fields, b"content-length")
    chunked, length = False, 0
    if te:
        if not any(v.strip(WS) for v in te):
            raise Reject("empty Transfer-Encoding" + (" with Content-Length" if cl else ""))
        if version == b"HTTP/1.0":
            raise Reject("Transfer-Encoding on HTTP/1.0")
        if cl:
            raise Reject("Transfer-Encoding with Content-Length")
        codings = [c.strip(WS).lower() for v in te for c in v.split(b",")]
        codings = [c for c in codings if c]                  # RFC 9110 §5.6.1: empty elements
        if not codings:
            raise Reject("empty Transfer-Encoding")
        if codings[-1] != b"chunked" or codings.count(b"chunked") > 1:
            raise Reject("Transfer-Encoding not ending in one chunked")
        if codings != [b"chunked"]:
            raise Reject("transfer-coding other than chunked (501)")
        chunked = True
    elif cl:
        if len(cl) > 1:
            raise Reject("more than one Content-Length")
        if not cl[0] or not set(cl[0]) <= DIGIT or len(cl[0]) > 18:
            raise Reject("malformed Content-Length")
        length = int(cl[0])
    tokens = {t.strip(WS).lower() for v in _values(fields, b"connection") for t in v.split(b",")}
    keep = b"keep-alive" in tokens if version == b"HTTP/1.0" else b"close" not in tokens
    return chunked, length, keep


def _host(value: bytes) -> None:
    """Host = uri-host [ ":" port ] (RFC 9110 §7.2, RFC 3986 §3.2.2)."""
    if value.startswith(b"["):
        end = value.find(b"]")
        if end < 0 or not set(value[1:end]) <= HEXDIG | frozenset(b":.vV") | UNRESERVED:
            raise Reject("malformed Host")
        rest = value[end + 1:]
    else:
        host, colon, port = value.partition(b":")
        try:
            _pct(host, UNRESERVED | SUB_DELIMS, "Host")
        except Reject:
            raise Reject("malformed Host") from None
        rest = colon + port
    if rest and (rest[:1] != b":" or not set(rest[1:]) <= DIGIT):
        raise Reject("malformed Host")


def _chunked(data: bytes, pos: int) -> tuple[bytes, int]:
    body = []
    while True:
        line, pos = _line(data, pos, "a chunk-size line")
        i = 0
        while i < len(line) and line[i] in HEXDIG:
            i += 1
        if i == 0 or int(line[:i], 16) >= 1 << 63:
            raise Reject("malformed chunk size")
        size = int(line[:i], 16)
        _chunk_ext(line[i:])
        if size == 0:
            break
        if len(data) - pos < size + 2:
            if len(data) - pos > size and data[pos + size] != 0x0D:
                raise Reject("chunk data not followed by CRLF")
            raise Partial()
        if data[pos + size:pos + size + 2] != b"\r\n":
            raise Reject("chunk data not followed by CRLF")
        body.append(data[pos:pos + size])
        pos += size + 2
    while True:
        line, pos = _line(data, pos, "a trailer field line", "the trailers")
        if not line:
            return b"".join(body), pos
        name, _ = _field(line, "trailer")
        if name in (b"content-length", b"transfer-encoding", b"host"):
            raise Reject(f"{name.decode()} in trailers")


def _chunk_ext(ext: bytes) -> None:
    """chunk-ext = *( BWS ";" BWS ext-name [ BWS "=" BWS ext-val ] )"""
    i, n = 0, len(ext)

    def bws(i):
        while i < n and ext[i] in WS:
            i += 1
        return i

    def token(i, what):
        j = i
        while j < n and ext[j] in TCHAR:
            j += 1
        if j == i:
            raise Reject(f"empty chunk extension {what}" if j == n or ext[j] in b";= \t"
                         else "malformed chunk extension")
        return j

    while i < n:
        i = bws(i)
        if i == n or ext[i] != 0x3B:
            raise Reject("malformed chunk extension")
        i = token(bws(i + 1), "name")
        j = bws(i)
        if j < n and ext[j] == 0x3D:
            i = bws(j + 1)
            if i < n and ext[i] == 0x22:                   # quoted-string
                i += 1
                while True:
                    if i >= n:
                        raise Reject("malformed chunk extension")
                    c = ext[i]
                    if c == 0x22:
                        i += 1
                        break
                    if c == 0x5C and i + 1 < n and (ext[i + 1] in FIELD_CHAR):
                        i += 2
                    elif c in QDTEXT:
                        i += 1
                    else:
                        raise Reject("malformed chunk extension")
            else:
                i = token(i, "value")
