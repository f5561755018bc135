"""The control protocol: `sockherd ctl` (or any ZeroMQ client) and the master.

A client sends one request and gets one reply, each a single ZeroMQ frame of
JSON (readable with zmq tools, typed with msgspec, decoded strictly). The
master's ROUTER socket sees [identity, b"", frame] from a REQ client and
[identity, frame] from a DEALER; it replies with the same envelope.

    request  {"command": "show proc", "args": {...}}
    reply    {"ok": true, "result": ...}   or   {"ok": false, "error": "why"}

A request larger than MAX_REQUEST (its frames after the identity, in all) or
of more than MAX_FRAMES frames, not JSON, of the wrong shape, naming an
unknown command or giving it arguments it does not take gets an error reply
that says which; it never reaches a command's code. Events (the PUB socket)
are one frame each: b"sockherd.event " + the event's JSON (master/events.py).
"""
from __future__ import annotations

from typing import Any

import msgspec

MAX_REQUEST = 64 * 1024
MAX_FRAMES = 32        # a REQ sends 2 after the identity; room for proxies' envelopes
# the error every request still owed or unread gets at an upgrade's exec: a
# client asks again (ctl upgrade's own wait does)
REEXECUTING = "the master is re-executing (an upgrade): ask again in a moment"
EVENT_TOPIC = b"sockherd.event "


class Request(msgspec.Struct, forbid_unknown_fields=True):
    command: str
    args: dict[str, Any] = {}


class Reply(msgspec.Struct, omit_defaults=True):
    ok: bool
    result: Any = None
    error: str = ""


class ProtocolError(ValueError):
    """A request that cannot be read: the message is the error reply."""


_decoder = msgspec.json.Decoder(Request)
_reply_decoder = msgspec.json.Decoder(Reply)
_encoder = msgspec.json.Encoder()


def too_large(size: int, frames: int, last: int) -> str:
    """The error reply to a request of size bytes in all, in frames frames
    after the identity, the last (the request itself) of last bytes."""
    if frames > MAX_FRAMES:
        return f"request of {frames} frames: at most {MAX_FRAMES}"
    if last > MAX_REQUEST:
        return f"request of {last} bytes: at most {MAX_REQUEST}"
    return f"request of {size} bytes in {frames} frames: at most {MAX_REQUEST} in all"


def decode_request(frame: bytes) -> Request:
    if len(frame) > MAX_REQUEST:
        raise ProtocolError(too_large(len(frame), 1, len(frame)))
    try:
        return _decoder.decode(frame)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"bad request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"bad request: not JSON ({exc})") from None
    except Exception as exc:                      # noqa: BLE001 - bytes from a client
        raise ProtocolError(f"bad request: {type(exc).__name__}: {exc}") from None


def encode(obj) -> bytes:
    return _encoder.encode(obj)


def decode_reply(frame: bytes) -> Reply:
    try:
        return _reply_decoder.decode(frame)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ProtocolError(f"bad reply: {exc}") from None
