"""websocket.accept's headers are read once (issue 35, point 1), and
checked as a head's (point 13). Point 1: the
accept checked each [name, value] pair through the sequence protocol
(PySequence_GetItem: the app's __getitem__) and then read the pairs again
to write them, so a pair, or the list of pairs, that answered differently
the second time put what was never checked into the 101's head: CR/LF
(a forged field; response splitting), a non-bytes object read as bytes
(the worker's heap on the wire, or a SIGSEGV). Now the pairs are taken
as the http scope takes a head's (h1_head_asgi.c: a tuple or a list,
items read from the object itself, no method of the app's runs), checked
and serialised into one owned block in the same pass, and that block is
what goes out.

The cases: a pair that is a sequence of the app's own (refused, as the
http scope refuses it: TypeError, the app's error, a 403 since nothing
was said); a list subclass pair whose __getitem__ lies on its second
call, or on every call (its real items are what is checked and written);
a pair whose
__getitem__ appends an unchecked pair (a list of 100k items as a name)
to the headers while they are checked. On the unfixed code the first two
put `x-injected` in the 101, the third sent ~100 kB of heap (ASan: a
heap-buffer-overflow read).

Point 13: a value with a control byte (a CTL but HTAB, or DEL) in a
header or in the subprotocol is refused with the http scope's check
(h1_has_ctl); the unfixed accept refused only CR, LF and NUL, and ESC,
DEL, VT... reached the 101.

A real Loop over a real fdcore Table on loopback (conftest.py's
serve_asgi); the 101 read off a raw socket. Runs under ASan
(test_http_asan.py, the ws part)."""
from __future__ import annotations

import base64
import os

import pytest

from test_wsgi import raw  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def ws_handshake(path: bytes) -> bytes:
    key = base64.b64encode(os.urandom(16))
    return (b"GET " + path + b" HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: " + key +
            b"\r\nSec-WebSocket-Version: 13\r\n\r\n")


BAD = b"v\r\nx-injected: 1"


class LiesLater:
    """A pair of the app's own type: valid items when first asked, a
    value with CR/LF and a forged field after."""

    def __init__(self):
        self.asked = 0

    def __len__(self):
        return 2

    def __getitem__(self, i):
        if i > 1:
            raise IndexError(i)
        self.asked += 1
        if i == 1 and self.asked > 2:
            return BAD
        return (b"x-a", b"ok")[i]


class ListLiesLater(list):
    """A list pair [b"x-b", b"ok"] whose __getitem__ lies from its third
    call on (the second read of the value)."""

    asked = 0

    def __getitem__(self, i):
        type(self).asked += 1
        if i == 1 and type(self).asked > 2:
            return BAD
        return list.__getitem__(self, i)


class AlwaysLies(list):
    """A list pair [b"x-d", b"ok"] whose __getitem__ always gives the
    forged value: only a read through the app's method sees it."""

    def __getitem__(self, i):
        return BAD if i == 1 else list.__getitem__(self, i)


class GrowsTheHeaders(list):
    """A list pair whose __getitem__ appends to the headers, once they
    were checked (its third call: the second read), a pair whose name is
    a list of 100k items."""

    def __init__(self, items, headers):
        super().__init__(items)
        self.headers, self.asked = headers, 0

    def __getitem__(self, i):
        self.asked += 1
        if self.asked == 3:
            self.headers.append((list(range(100_000)), b"v"))
        return list.__getitem__(self, i)


def accept_app(make_headers, seen):
    async def app(scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        try:
            await send({"type": "websocket.accept", "headers": make_headers()})
            seen.append("accepted")
        except Exception as exc:                      # noqa: BLE001
            seen.append(exc)
    return app


def head_of(out: bytes) -> bytes:
    return out.partition(b"\r\n\r\n")[0]


def test_a_pair_of_the_apps_own_type_is_refused_never_written(serve_asgi):
    seen = []
    _, addr = serve_asgi(accept_app(lambda: [LiesLater()], seen))
    out = raw(addr, ws_handshake(b"/own"))
    assert b"x-injected" not in out, out
    # refused as the http scope refuses it: the app's error, nothing said: 403
    assert out.startswith(b"HTTP/1.1 403"), out
    assert len(seen) == 1 and isinstance(seen[0], TypeError), seen
    assert "not a [name, value] pair of bytes" in str(seen[0]), seen


def test_a_list_pair_whose_getitem_lies_is_written_as_it_holds(serve_asgi):
    seen = []
    ListLiesLater.asked = 0
    _, addr = serve_asgi(accept_app(lambda: [ListLiesLater([b"x-b", b"ok"])], seen))
    out = raw(addr, ws_handshake(b"/list"))
    head = head_of(out)
    assert head.startswith(b"HTTP/1.1 101"), out
    assert b"x-injected" not in out, out
    assert b"\r\nx-b: ok" in head, head
    assert seen == ["accepted"], seen


def test_a_list_pair_is_read_as_it_holds_never_through_its_getitem(serve_asgi):
    """The pair's own items are what is checked and written (on the
    unfixed code: refused, its __getitem__'s forged value checked; with
    the write's read through __getitem__ put back: x-injected in the 101)."""
    seen = []
    _, addr = serve_asgi(accept_app(lambda: [AlwaysLies([b"x-d", b"ok"])], seen))
    out = raw(addr, ws_handshake(b"/always"))
    head = head_of(out)
    assert b"x-injected" not in out, out
    assert head.startswith(b"HTTP/1.1 101") and head.endswith(b"\r\nx-d: ok"), out
    assert seen == ["accepted"], seen


def test_headers_grown_while_checked_do_not_reach_the_wire(serve_asgi):
    seen = []

    def headers():
        h = []
        h.append(GrowsTheHeaders([b"x-c", b"ok"], h))
        return h

    _, addr = serve_asgi(accept_app(headers, seen))
    out = raw(addr, ws_handshake(b"/grow"))
    head = head_of(out)
    assert head.startswith(b"HTTP/1.1 101"), out[:300]
    # the head is ours and the one pair: no heap bytes, no other field
    assert len(head) < 400, (len(head), head[:300])
    assert head.count(b"\r\n") == 5 and head.endswith(b"\r\nx-c: ok"), head
    assert seen == ["accepted"], seen


# ---- control bytes in the 101's values (issue 35, point 13) ----

@pytest.mark.parametrize("value", [b"a\x01b", b"a\x7fb", b"a\x00b", b"\x1b[31m", b"a\x0bb"])
def test_a_header_value_with_a_control_byte_is_refused(serve_asgi, value):
    """A value with a CTL (but HTAB) or DEL is refused with the http
    scope's own check (h1_head_asgi.c asgi_pair): the app's error, never
    on the wire (the unfixed accept refused only CR, LF and NUL)."""
    seen = []
    _, addr = serve_asgi(accept_app(lambda: [(b"x-v", value)], seen))
    out = raw(addr, ws_handshake(b"/ctl"))
    assert out.startswith(b"HTTP/1.1 403"), out
    assert b"x-v" not in out, out
    assert len(seen) == 1 and isinstance(seen[0], ValueError), seen
    assert "value with a control character" in str(seen[0]), seen


def test_a_header_value_with_htab_and_obs_text_is_written(serve_asgi):
    """What a field value may carry (RFC 9110 5.5): HTAB, obs-text."""
    seen = []
    _, addr = serve_asgi(accept_app(lambda: [(b"x-v", b"a\tb\xe9")], seen))
    head = head_of(raw(addr, ws_handshake(b"/tab")))
    assert head.startswith(b"HTTP/1.1 101") and head.endswith(b"\r\nx-v: a\tb\xe9"), head
    assert seen == ["accepted"], seen


@pytest.mark.parametrize("sub", ["a\x01b", "a\x7fb", "chat\x1b"])
def test_a_subprotocol_with_a_control_byte_is_refused(serve_asgi, sub):
    """The subprotocol is the 101's Sec-WebSocket-Protocol value: the same
    check (the unfixed accept refused only CR, LF and NUL)."""
    seen = []

    async def app(scope, receive, send):
        if scope["type"] != "websocket":
            return
        await receive()
        try:
            await send({"type": "websocket.accept", "subprotocol": sub})
            seen.append("accepted")
        except Exception as exc:                      # noqa: BLE001
            seen.append(exc)
    _, addr = serve_asgi(app)
    out = raw(addr, ws_handshake(b"/sub"))
    assert out.startswith(b"HTTP/1.1 403"), out
    assert b"Sec-WebSocket-Protocol" not in out, out
    assert len(seen) == 1 and isinstance(seen[0], ValueError), seen
    assert "control character" in str(seen[0]), seen
