"""messages.decode() against hostile payloads that are well-framed msgpack: whatever the
bytes, the outcome is a message or a MessageError naming the problem, never another
exception (the hand-off server and the master loop survive only MessageError)."""

import sys

import msgspec
import pytest

from sockherd.ipc import messages as m
from sockherd.ipc.errors import MessageError


def fixstr(raw: bytes) -> bytes:
    """A msgpack str holding raw bytes as they are, valid UTF-8 or not."""
    assert len(raw) < 32
    return bytes([0xa0 | len(raw)]) + raw


def fixmap(*pairs: bytes) -> bytes:
    assert len(pairs) % 2 == 0 and len(pairs) < 32
    return bytes([0x80 | len(pairs) // 2]) + b"".join(pairs)


def fixarray(*items: bytes) -> bytes:
    return bytes([0x90 | len(items)]) + b"".join(items)


def s(text: str) -> bytes:
    return fixstr(text.encode())


BAD = b"\xff"  # never valid in UTF-8

DESCRIPTOR = [s("name"), s("web"), s("family"), s("unix"), s("address"), s("@x")]


def assignment(config: bytes, listener: bytes = b"") -> bytes:
    return fixmap(s("type"), s("assignment"), s("generation"), b"\x01",
                  s("worker_index"), b"\x00", s("config"), config, s("app"), s("a:b"),
                  s("listeners"), fixarray(listener) if listener else fixarray())


@pytest.mark.parametrize("payload", [
    fixmap(s("type"), fixstr(BAD)),                                   # the tag
    fixmap(s("type"), s("ready"), fixstr(b"p\xffid"), b"\x01"),          # a field name
    fixmap(s("type"), s("error"), s("message"), fixstr(b"oops" + BAD)),   # a str field
    fixmap(s("type"), s("handoff_confirm"), s("names"), fixarray(s("a"), fixstr(BAD))),
    fixmap(s("type"), s("stats_reply"), s("request_id"), b"\x01",
           s("stats"), fixmap(fixstr(BAD), b"\x01")),                 # a dict key
    assignment(fixmap(s("k"), fixstr(BAD))),                          # config value
    assignment(fixmap(fixstr(BAD), b"\x01")),                         # config key
    assignment(fixmap(s("k"), fixarray(fixmap(s("n"), fixstr(BAD))))),   # nested in config
    assignment(fixmap(), fixmap(*DESCRIPTOR[:-1], fixstr(BAD))),      # descriptor address
    assignment(fixmap(), fixmap(*DESCRIPTOR, s("options"), fixmap(fixstr(BAD), b"\x01"))),
], ids=lambda p: p.hex())
def test_invalid_utf8_anywhere_is_a_message_error(payload):
    with pytest.raises(MessageError, match="^invalid UTF-8 in a string: invalid start byte ff "
                                           r"at offset \d+ of a \d+-byte string$"):
        m.decode(payload)


def test_invalid_utf8_in_a_key_before_the_tag_is_named_too():
    # msgspec compares keys as bytes while it looks for the tag, so up to 0.22 this was
    # "no `type` field"; the ipc layer's own check names the bad string whatever msgspec
    # is installed (issue 34: 0.23 changed its words for invalid UTF-8).
    with pytest.raises(MessageError, match="^invalid UTF-8 in a string: invalid start byte ff "
                                           "at offset 2 of a 5-byte string$"):
        m.decode(fixmap(fixstr(b"ty\xffpe"), s("stop")))


@pytest.mark.parametrize("head", [b"\xd9", b"\xda\x00", b"\xdb\x00\x00\x00"],
                         ids=["str8", "str16", "str32"])
def test_invalid_utf8_in_a_long_string_is_named(head):
    text = b"x" * 40 + b"\xed\xa0\x80"      # a surrogate: Python's strict codec refuses it
    payload = fixmap(s("type"), s("error"), s("message"), head + bytes([len(text)]) + text)
    with pytest.raises(MessageError, match="^invalid UTF-8 in a string: invalid continuation "
                                           "byte ed at offset 40 of a 43-byte string$"):
        m.decode(payload)


def nested_arrays(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


def nested_maps(depth: int) -> bytes:
    return fixmap(s("k"), b"\xc0") if depth == 1 else b"\x81\xa1k" * (depth - 1) + b"\xc0"


def test_deep_nesting_in_config_is_a_message_error():
    # About 2 KB of nested arrays: msgspec would recurse once per level (RecursionError).
    payload = assignment(fixmap(s("deep"), nested_arrays(2048)))
    with pytest.raises(MessageError, match=r"^message nests deeper than \d+ levels "
                                           r"\(container at byte \d+\)$"):
        m.decode(payload)


@pytest.mark.parametrize("value", [nested_arrays(100_000), nested_maps(20_000),
                                   b"\xdd\x00\x00\x00\x01" * 5000 + b"\xc0"],
                         ids=["arrays", "maps", "array32"])
def test_deep_nesting_of_any_kind_anywhere_is_a_message_error(value):
    # Before the tag, as an unknown field, inside a dict of the wrong type: the decoder
    # must never walk it.
    for payload in [fixmap(s("junk"), value, s("type"), s("stop")),
                    fixmap(s("type"), s("stop"), s("junk"), value),
                    fixmap(s("type"), s("stats_reply"), s("request_id"), b"\x01",
                           s("stats"), fixmap(s("k"), value)),
                    assignment(fixmap(s("deep"), value))]:
        with pytest.raises(MessageError, match="nests deeper than"):
            m.decode(payload)


def test_nesting_up_to_the_limit_decodes():
    # The message map is level 1, config level 2: the config may nest MAX_DEPTH - 2 more.
    inner = m.MAX_DEPTH - 2
    msg = m.decode(assignment(fixmap(s("deep"), nested_arrays(inner))))
    value = msg.config["deep"]
    for _ in range(inner):
        value, = value
    assert value is None
    with pytest.raises(MessageError, match=f"nests deeper than {m.MAX_DEPTH} levels"):
        m.decode(assignment(fixmap(s("deep"), nested_arrays(inner + 1))))


def test_a_legitimate_large_assignment_is_not_mistaken_for_deep_nesting():
    # Many containers side by side (one per listener and per config entry) are not deep.
    msg = m.Assignment(generation=1, worker_index=0,
                       config={f"k{i}": [{"a": [i]}] for i in range(500)}, app="a:b",
                       listeners=[m.ListenerDescriptor(f"l{i}", "unix", f"@l{i}",
                                                       options={"backlog": 1})
                                  for i in range(300)])
    assert m.decode(m.encode(msg)) == msg


@pytest.mark.skipif(sys.version_info >= (3, 12), reason=(
    "Python 3.12+ counts C recursion apart from Python frames: a caller's deep Python "
    "stack leaves msgspec's C recursion its whole budget, so within MAX_DEPTH this cannot "
    "happen there; the net stays for 3.11"))
def test_recursion_error_is_still_a_message_error():
    # The safety net: were a message within MAX_DEPTH still too deep for the stack that is
    # left (decode called from deep inside a caller), msgspec's RecursionError becomes a
    # MessageError too.
    payload = assignment(fixmap(s("deep"), nested_arrays(m.MAX_DEPTH - 2)))

    def at_depth(n):
        return at_depth(n - 1) if n else m.decode(payload)

    frames, frame = 0, sys._getframe()
    while frame is not None:
        frames, frame = frames + 1, frame.f_back
    with pytest.raises(MessageError, match="recursion"):
        at_depth(sys.getrecursionlimit() - frames - 10)


@pytest.mark.parametrize("payload, message", [
    (b"", "truncated"),
    (fixmap(s("type"), s("stop"))[:-2], "truncated"),
    (b"\xdf\xff\xff\xff\xff", "truncated"),                 # map of 4G entries, none there
    # Huge lengths past enough container bytes that the nesting walk runs, and trips on them.
    (assignment(fixmap(s("x"), b"\xdc\x00\x29" + b"\x90" * 40 + b"\xdb\xff\xff\xff\xff")),
     "truncated"),                                          # str 32
    (assignment(fixmap(s("x"), b"\xdc\x00\x29" + b"\x90" * 40 + b"\xc6\xff\xff\xff\xff")),
     "truncated"),                                          # bin 32
    (assignment(fixmap(s("x"), b"\xdc\x00\x29" + b"\x90" * 40 + b"\xc9\xff\xff\xff\xff\x01")),
     "truncated"),                                          # ext 32
    (assignment(fixmap(s("x"), b"\xdc\x00\x29" + b"\x90" * 40 + b"\xdf\xff\xff\xff\xff")),
     "truncated"),                                          # map 32
    (b"\xdd\xff\xff\xff\xff" * 40, "nests deeper than 32 levels"),
    (b"\xc1", "invalid"),                                   # the one reserved byte
    (fixmap(s("type"), s("stop")) + b"\x00", "trailing"),
])
def test_truncated_and_invalid_msgpack(payload, message):
    with pytest.raises(MessageError, match=message):
        m.decode(payload)



@pytest.mark.parametrize("tag", ["ready", "handoff_request"])
@pytest.mark.parametrize("pid", [0, -1, 2**22 + 1, 2**64 - 1])
def test_a_pid_that_no_process_can_have_is_refused(tag, pid):
    # Whoever acts on a pid from a peer may signal it: kill(0) is our process group,
    # kill(-1) every process we may signal. Only 1..PID_MAX_LIMIT (2**22) can be a process.
    payload = msgspec.msgpack.encode({"type": tag, "pid": pid})
    with pytest.raises(MessageError, match=r"^field `\$\.pid`: "):
        m.decode(payload)
    assert m.decode(msgspec.msgpack.encode({"type": tag, "pid": 2**22})).pid == 2**22


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 1e300])
def test_times_must_be_finite_monotonic_values(value):
    """A NaN deadline decoded fine and then broke every comparison made
    with it (found by the decoder fuzz test)."""
    import msgspec
    from sockherd.ipc import messages as m
    from sockherd.ipc.errors import MessageError

    for msg in (m.Drain(deadline=0.0), m.Heartbeat(seq=1, sent_at=0.0)):
        raw = msgspec.msgpack.encode({**msgspec.structs.asdict(msg),
                                      "type": type(msg).__struct_config__.tag,
                                      **({"deadline": value} if isinstance(msg, m.Drain)
                                         else {"sent_at": value})})
        with pytest.raises(MessageError):
            m.decode(raw)
