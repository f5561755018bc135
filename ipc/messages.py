"""The typed messages exchanged by master and workers (and by two masters during a
listener hand-off), and their msgpack encoding.

One tagged union, decoded strictly: an unknown `type`, a missing or extra field or a wrong
type becomes a MessageError naming the field in our words (wording.py: "unknown field
`now`", "field `$.generation`: ..." with msgspec's path). So does anything else a peer
can put in well-framed bytes: invalid UTF-8 in any string, nesting deeper than MAX_DEPTH (see nesting.py),
truncated or invalid msgpack. decode() raises nothing but MessageError, whatever the
payload. Times are CLOCK_MONOTONIC seconds (time.monotonic()), which on Linux is one clock
for every process of the machine.
"""

import re
from typing import Annotated, Any, Literal, Union

import msgspec

from .errors import MessageError
from .listeners import ListenerDescriptor
from .nesting import scan
from .wording import validation_words


# A pid a process can have: 1..PID_MAX_LIMIT (2**22 on 64-bit Linux). Whoever acts on a
# pid from a peer may signal it, and kill(0) is our own process group, kill(-1) every
# process we may signal: such values are refused at the door.
Pid = Annotated[int, msgspec.Meta(ge=1, le=2**22)]
# a time.monotonic() value: finite and not negative (NaN fails every bound,
# so a hostile NaN or infinity is refused, never compared with)
Monotonic = Annotated[float, msgspec.Meta(ge=0, le=1e12)]


class _Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type"):
    pass


class Assignment(_Message, tag="assignment"):
    """Master -> worker, first message: who the worker is and what it serves. The listener
    fds ride along in descriptor order."""

    generation: int
    worker_index: int
    config: dict[str, Any]
    app: str
    listeners: list[ListenerDescriptor] = []
    board_slot: int = -1      # its row on the balance board (-1: worker_index)


class Ready(_Message, tag="ready"):
    """Worker -> master: listeners are polled, the worker accepts connections."""

    pid: Pid


class FailedBeforeReady(_Message, tag="failed_before_ready"):
    """Worker -> master: the worker gives up before READY (import error, bad listener...)."""

    reason: str


class Heartbeat(_Message, tag="heartbeat"):
    """Liveness: a worker sends one every heartbeat_interval; the master may
    also send one as a probe, which the worker echoes back unchanged."""

    seq: int
    sent_at: Monotonic


class Retiring(_Message, tag="retiring"):
    """Worker -> master: it reached max_requests, or (reason) a request
    outlived `timeout` in the app; it serves on until the master, once a
    replacement is READY, tells it to drain."""

    requests: Annotated[int, msgspec.Meta(ge=0)]
    reason: Annotated[str, msgspec.Meta(max_length=4096)] = ""


class Drain(_Message, tag="drain"):
    """Master -> worker: stop accepting, finish in-flight work, exit by `deadline`
    (time.monotonic() value) at the latest."""

    deadline: Monotonic


class Standby(_Message, tag="standby"):
    """Master -> worker: `on`: stop accepting (a reload's previous generation
    on probation: only the new code answers), finish what is in flight, let
    kept-alive clients go (Connection: close, idle ones closed) and wait;
    off: accept again (the reload rolled back)."""

    on: bool


class Stop(_Message, tag="stop"):
    """Master -> worker: exit now, without draining."""


class StatsRequest(_Message, tag="stats_request"):
    """Master -> worker: its figures, for the control channel and the metrics
    (asked on demand: an idle tree stays idle). `what`: "proc" (requests,
    connections, threads), "activity" (each loop thread's fdcore counters),
    "fd" (its fd table; `fd` >= 0 for that one only)."""
    request_id: int
    what: Literal["proc", "activity", "fd"] = "proc"
    fd: Annotated[int, msgspec.Meta(ge=-1)] = -1


class StatsReply(_Message, tag="stats_reply"):
    """Worker -> master: the answer to the StatsRequest of the same id."""
    request_id: int
    stats: dict[str, Any]


class Error(_Message, tag="error"):
    """Either side: the last message could not be handled, and why."""

    message: str


class HandoffRequest(_Message, tag="handoff_request"):
    """New instance -> running instance: send me your listeners."""

    pid: Pid


class HandoffListeners(_Message, tag="handoff_listeners"):
    """Running instance -> new instance: the listeners, fds in descriptor order."""

    listeners: list[ListenerDescriptor]


class HandoffConfirm(_Message, tag="handoff_confirm"):
    """New instance -> running instance: every listener was received and checked."""

    names: list[str]


Message = Union[Assignment, Ready, FailedBeforeReady, Heartbeat, Retiring, Drain, Standby, Stop,
                StatsRequest, StatsReply, Error, HandoffRequest, HandoffListeners,
                HandoffConfirm]

MESSAGE_TYPES = Message.__args__

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)
# The message map is level 1, a listener's options map level 4 and Assignment.config level
# 2, so a config may nest MAX_DEPTH - 2 levels of its own: far more than any settings file,
# far less than the recursion limit leaves msgspec even deep inside a caller.
MAX_DEPTH = 32
_UNKNOWN_TAG = re.compile(r"Invalid value (.*) - at `\$\.type`$")


def encode(msg) -> bytes:
    if not isinstance(msg, MESSAGE_TYPES):
        raise TypeError(f"not a sockherd.ipc message: {type(msg).__name__}")
    return _encoder.encode(msg)


def decode(payload: bytes):
    """Payload bytes -> message, or MessageError with msgspec's precise reason."""
    too_deep, bad = scan(payload, MAX_DEPTH)
    if too_deep is not None:
        raise MessageError(f"message nests deeper than {MAX_DEPTH} levels "
                           f"(container at byte {too_deep})")
    if bad is not None:
        raise MessageError(_bad_string(payload, *bad))
    try:
        return _decoder.decode(payload)
    except msgspec.ValidationError as exc:
        unknown = _UNKNOWN_TAG.match(str(exc))
        if unknown:
            raise MessageError(f"unknown message type {unknown.group(1)}") from None
        raise MessageError(validation_words(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise MessageError(str(exc)) from None
    except RecursionError:
        # Safety net: within MAX_DEPTH, yet deeper than the stack the caller left us.
        raise MessageError("message nests too deep for the recursion limit left to "
                           "decode it") from None
    except Exception as exc:
        # msgspec documents DecodeError and ValidationError only, yet lets the two above
        # through; anything else it raises on bytes from a peer is still about those
        # bytes, and callers (the hand-off server, the master loop) survive MessageError.
        raise MessageError(f"undecodable message: {type(exc).__name__}: {exc}") from None


def _bad_string(payload: bytes, offset: int, length: int) -> str:
    """Our words for a str item that is not UTF-8 (first_bad_string found it at
    payload[offset:offset + length]): msgspec's changed between its releases, and it
    gives no path, so name the string's bad bytes and where they are."""
    raw = bytes(payload[offset:offset + length])
    try:
        raw.decode()
    except UnicodeDecodeError as exc:
        bad = raw[exc.start:exc.end]
        return (f"invalid UTF-8 in a string: {exc.reason} {bad.hex(' ')} "
                f"at offset {exc.start} of a {length}-byte string")
    # the C check and Python's codec disagree: say so rather than guess
    return f"invalid UTF-8 in the {length}-byte string at byte {offset}"


def expected_fds(msg) -> int:
    """How many fds must accompany msg: one per listener descriptor, none otherwise."""
    if isinstance(msg, (Assignment, HandoffListeners)):
        return len(msg.listeners)
    return 0
