"""How deep a msgpack payload nests, measured before anything decodes it.

Some facts about msgspec that make this necessary:

* it decodes every array and map by a recursive C call, checked against Python's
  recursion limit, so 2 KB of nested arrays in an `Any` field (Assignment.config) raise
  RecursionError; so does a deep value before the `type` key of a tagged union (skipped,
  recursively, while looking for the tag);
* how deep it gets before that depends on how much of the recursion limit the caller has
  already used, so the same payload may decode in one place and fail in another.

So the ipc layer sets its own bound, independent of the caller: first_too_deep() walks
the structure with an explicit stack of "items left in each open container" and stops at
the first container opened past the limit. It measures nesting and nothing else; a payload
that is truncated or holds a reserved byte ends the walk and is left to the decoder, whose
words for those problems are better.

The walk is pure Python, so it runs only when it can find something: nesting N deep
takes N container headers, and counting the bytes that could be one (a translate() at C
speed) bounds their number from above, so most messages never reach the walk. A payload
built to be slow still costs about 0.1 to
0.25 us per byte (measured on a 2-core machine): 2-4 s at the 16 MB frame cap
(frames.MAX_FRAME), several times what msgspec takes for the same bytes. A channel whose
peer only ever sends small messages (worker -> master) can bound that with max_frame.
"""

# Per first byte of an item: its total size when fixed (_FIXED), else the size of the
# big-endian length or count that follows it (_LEN), the ext type byte after that
# (_EXTRA), and for containers how many items each count stands for (_ITEMS: 1 per array
# element, 2 per map entry). The msgpack spec's format table, as data.
_FIXED = [0] * 256
_LEN = [0] * 256
_EXTRA = [0] * 256
_ITEMS = [0] * 256
for _b in range(256):
    if _b <= 0x7f or _b >= 0xe0 or _b in (0xc0, 0xc2, 0xc3):  # fixint, nil, false, true
        _FIXED[_b] = 1
    elif _b <= 0x8f:                                            # fixmap
        _ITEMS[_b] = 2
    elif _b <= 0x9f:                                            # fixarray
        _ITEMS[_b] = 1
    elif _b <= 0xbf:                                            # fixstr
        _FIXED[_b] = 1 + (_b & 0x1f)
for _b, _size in {0xcc: 2, 0xd0: 2, 0xcd: 3, 0xd1: 3, 0xca: 5, 0xce: 5, 0xd2: 5,
                  0xcb: 9, 0xcf: 9, 0xd3: 9,                    # ints and floats
                  0xd4: 3, 0xd5: 4, 0xd6: 6, 0xd7: 10, 0xd8: 18}.items():   # fixext
    _FIXED[_b] = _size
for _b, _size in {0xc4: 1, 0xc5: 2, 0xc6: 4, 0xd9: 1, 0xda: 2, 0xdb: 4}.items():  # bin, str
    _LEN[_b] = _size
for _b, _size in {0xc7: 1, 0xc8: 2, 0xc9: 4}.items():         # ext 8/16/32
    _LEN[_b], _EXTRA[_b] = _size, 1
for _b, _size, _items in [(0xdc, 2, 1), (0xdd, 4, 1), (0xde, 2, 2), (0xdf, 4, 2)]:
    _LEN[_b], _ITEMS[_b] = _size, _items                        # array 16/32, map 16/32
# 0xc1 is reserved: all zero, the walk stops there.

_NOT_HEADERS = bytes(b for b in range(256) if not _ITEMS[b])


def first_too_deep(payload: bytes, limit: int) -> int | None:
    """Offset of the first container header nested deeper than limit levels (the outermost
    container is level 1), or None if there is none before the walk ends."""
    if len(payload.translate(None, _NOT_HEADERS)) <= limit:
        return None
    fixed, lengths, extra, per_count = _FIXED, _LEN, _EXTRA, _ITEMS
    end = len(payload)
    outer: list[int] = []   # items still to read in each enclosing container
    remaining = 1           # items still to read at this level; level 0 is the payload
    pos = 0
    while True:
        if not remaining:
            if not outer:
                return None
            remaining = outer.pop()
            continue
        if pos >= end:
            return None                      # truncated: the decoder says so
        remaining -= 1
        first = payload[pos]
        if fixed[first]:
            pos += fixed[first]
            continue
        size = lengths[first]
        if size:
            count = int.from_bytes(payload[pos + 1:pos + 1 + size], "big")
        elif per_count[first]:
            count = first & 0x0f
        else:
            return None                      # reserved byte: the decoder says so
        if not per_count[first]:
            pos += 1 + size + extra[first] + count
            continue
        if len(outer) >= limit:              # this container is level len(outer) + 1
            return pos
        pos += 1 + size
        if count:                            # an empty one opens and closes at once
            outer.append(remaining)
            remaining = count * per_count[first]
