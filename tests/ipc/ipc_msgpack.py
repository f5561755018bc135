"""Hand-built msgpack for the fuzz tests: payloads that are well-formed msgpack yet hostile
(strings holding any bytes, deep nesting), shaped like every message type.

msgspec's own encoder cannot write a str that is not UTF-8 nor nest past its recursion
limit, so values are trees of the small types below, packed here; depth() is the reference
the decoder's nesting bound is checked against. Imported as a plain sibling module."""

import struct
from typing import NamedTuple

import hypothesis.strategies as st
import msgspec.inspect as mi

from sockherd.ipc import messages as m


class Str(bytes):
    """A msgpack str with exactly these bytes inside, UTF-8 or not."""


class Bin(bytes):
    """A msgpack bin."""


class Map(tuple):
    """A msgpack map: a tuple of (key, value) pairs, keys of any type, duplicates allowed."""


class Ext(NamedTuple):
    code: int
    data: bytes


class Deep(NamedTuple):
    """`depth` containers one inside the other around `leaf`, packed without recursion."""
    depth: int
    kind: str             # "array", "map" (key "k"), "array32" (a 5-byte header per level)
    leaf: object


def _sized(n: int, fix: int | None, fix_max: int, wide: list[tuple[int, int]]) -> bytes:
    if fix is not None and n <= fix_max:
        return bytes([fix | n])
    for code, size in wide:
        if n < 1 << (8 * size):
            return bytes([code]) + n.to_bytes(size, "big")
    raise ValueError(f"{n} items or bytes do not fit msgpack")


def pack(value) -> bytes:
    if value is None:
        return b"\xc0"
    if value is True or value is False:
        return b"\xc3" if value else b"\xc2"
    if isinstance(value, int):
        if -32 <= value < 128:                               # positive or negative fixint
            return value.to_bytes(1, "big", signed=True)
        if value < 0:
            return b"\xd3" + value.to_bytes(8, "big", signed=True)   # int 64
        if value < 1 << 32:
            return b"\xce" + value.to_bytes(4, "big")                # uint 32
        return b"\xcf" + value.to_bytes(8, "big")                    # uint 64
    if isinstance(value, float):
        return b"\xcb" + struct.pack("!d", value)
    if isinstance(value, Str):
        return _sized(len(value), 0xa0, 31, [(0xd9, 1), (0xda, 2), (0xdb, 4)]) + value
    if isinstance(value, Bin):
        return _sized(len(value), None, 0, [(0xc4, 1), (0xc5, 2), (0xc6, 4)]) + value
    if isinstance(value, Ext):
        fixed = {1: 0xd4, 2: 0xd5, 4: 0xd6, 8: 0xd7, 16: 0xd8}.get(len(value.data))
        head = bytes([fixed]) if fixed else _sized(len(value.data), None, 0,
                                                   [(0xc7, 1), (0xc8, 2), (0xc9, 4)])
        return head + struct.pack("b", value.code) + value.data
    if isinstance(value, Map):
        return _sized(len(value), 0x80, 15, [(0xde, 2), (0xdf, 4)]) + b"".join(
            pack(k) + pack(v) for k, v in value)
    if isinstance(value, list):
        return _sized(len(value), 0x90, 15, [(0xdc, 2), (0xdd, 4)]) + b"".join(
            pack(v) for v in value)
    if isinstance(value, Deep):
        head = {"array": b"\x91", "map": b"\x81\xa1k", "array32": b"\xdd\x00\x00\x00\x01"}
        return head[value.kind] * value.depth + pack(value.leaf)
    raise TypeError(f"cannot pack {type(value).__name__}")


def depth(value) -> int:
    """Nesting depth: 0 for a scalar, 1 + the deepest item (keys too) for a container."""
    if isinstance(value, Deep):
        return value.depth + depth(value.leaf)
    if isinstance(value, Map):
        return 1 + max((max(depth(k), depth(v)) for k, v in value), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


# -- strategies ----------------------------------------------------------------------------

def text(s: str) -> Str:
    return Str(s.encode())


# Mostly valid UTF-8 (so the decoder gets past a string now and then), often not.
hostile_str = st.one_of(
    st.text(max_size=12).map(text),
    st.binary(max_size=12).map(Str),
    st.tuples(st.text(max_size=6), st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80",
                                                    b"\xf8\x88\x80\x80\x80", b"\x80"]),
              st.text(max_size=6)).map(lambda t: Str(t[0].encode() + t[1] + t[2].encode())),
)

scalar = st.one_of(
    st.none(), st.booleans(),
    st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True),
    hostile_str, st.binary(max_size=12).map(Bin),
    st.builds(Ext, st.integers(-128, 127), st.binary(max_size=20)),
)

# Right at MAX_DEPTH, a little past it, and far past the recursion limit.
deep = st.builds(
    Deep,
    st.one_of(st.integers(m.MAX_DEPTH - 4, m.MAX_DEPTH + 2), st.sampled_from([500, 2048, 20_000])),
    st.sampled_from(["array", "map", "array32"]),
    scalar,
)


def _containers(children):
    pairs = st.tuples(st.one_of(hostile_str, children), children)
    return st.one_of(st.lists(children, max_size=4), st.lists(pairs, max_size=4).map(Map))


# A deep leaf now and then; more would make every value a deep one.
any_value = st.recursive(st.one_of(scalar, scalar, scalar, deep), _containers, max_leaves=12)


def _for_type(info):
    """Values shaped like a msgspec type (with hostile strings), or anything at all."""
    if isinstance(info, mi.StructType):
        return struct_map(info)
    if isinstance(info, mi.IntType):
        shaped = st.integers(-2**63, 2**64 - 1)
    elif isinstance(info, mi.FloatType):
        shaped = st.floats()
    elif isinstance(info, mi.BoolType):
        shaped = st.booleans()
    elif isinstance(info, mi.StrType):
        shaped = hostile_str
    elif isinstance(info, mi.LiteralType):
        shaped = st.one_of(st.sampled_from(info.values).map(text), hostile_str)
    elif isinstance(info, mi.ListType):
        shaped = st.lists(_for_type(info.item_type), max_size=3)
    elif isinstance(info, mi.DictType):
        shaped = st.lists(st.tuples(_for_type(info.key_type), _for_type(info.value_type)),
                          max_size=3).map(Map)
    elif isinstance(info, mi.UnionType):
        shaped = st.one_of([_for_type(t) for t in info.types])
    else:                                                  # Any
        return any_value
    return st.one_of(shaped, shaped, shaped, any_value)    # mostly the right shape


@st.composite
def _struct_map(draw, info):
    fields = [(text(f.encode_name), draw(_for_type(f.type))) for f in info.fields
              if f.required or draw(st.booleans())]
    if info.tag is not None:
        fields.append((text(info.tag_field), draw(st.one_of(st.just(text(info.tag)),
                                                            hostile_str))))
    if draw(st.integers(0, 9)) == 0:                       # an unknown field now and then
        fields.append((draw(hostile_str), draw(any_value)))
    return Map(draw(st.permutations(fields)))


def struct_map(info):
    return _struct_map(info)


# Every message type, as a map of its fields (tag first or not), with hostile values.
message_tree = st.one_of([struct_map(t) for t in mi.type_info(m.Message).types])
