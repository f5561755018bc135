"""The control protocol: `sockherd ctl` (or any ZeroMQ client) and the master.

A client sends one request and gets one reply, each a single ZeroMQ frame of
JSON (readable with zmq tools, typed with msgspec, decoded strictly). The
master's ROUTER socket sees [identity, b"", frame] from a REQ client and
[identity, frame] from a DEALER; it replies with the same envelope.

    request  {"command": "show proc", "args": {...}}
    reply    {"ok": true, "result": ...}   or   {"ok": false, "error": "why"}

The envelope is bounded (issue 19 §5: an envelope of 80 frames of 10 MB was
held and echoed back, 1.6 GB): after the identity ZeroMQ gives (at most 255
bytes), at most one envelope frame of at most MAX_ENVELOPE_FRAME bytes (a
REQ's empty delimiter), then the request. Any other shape is refused: the
error goes to the identity and that one frame if it fits, nothing else is
kept. A request larger than MAX_REQUEST, not JSON, of the wrong shape, naming
an unknown command or giving it arguments it does not take gets an error
reply that says which; it never reaches a command's code. A frame larger
than MAX_MESSAGE never reaches us: libzmq closes that connection as soon as
it reads the frame's length (ZMQ_MAXMSGSIZE), before holding any of it. Events (the PUB socket)
are one frame each: b"sockherd.event " + the event's JSON (master/events.py).
"""
from __future__ import annotations

from typing import Any

import msgspec

MAX_REQUEST = 64 * 1024
MAX_ENVELOPE_FRAME = 255   # bytes: ZeroMQ's own bound on a routing id
# ZMQ_MAXMSGSIZE of the ROUTER: a request up to 4x the cap still gets the
# clear error above; a larger frame is cut by libzmq, the client sees no reply
MAX_MESSAGE = 4 * MAX_REQUEST
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


def too_large(size: int) -> str:
    """The error reply to a request (its last frame) of size bytes."""
    return f"request of {size} bytes: at most {MAX_REQUEST}"


def bad_envelope(frames: int, largest: int) -> str:
    """The error reply to a message of frames frames after the routing id,
    the largest of them before the last of largest bytes."""
    return (f"request of {frames} frames after the routing id (the largest envelope frame "
            f"{largest} bytes): a request is one frame, after at most one envelope frame "
            f"of at most {MAX_ENVELOPE_FRAME} bytes (a REQ client's empty delimiter)")


def decode_request(frame: bytes) -> Request:
    if len(frame) > MAX_REQUEST:
        raise ProtocolError(too_large(len(frame)))
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
