"""How deep a msgpack payload nests, measured before anything decodes it.

Some facts about msgspec that make this necessary:

* it decodes every array and map by a recursive C call, checked against Python's
  recursion limit, so 2 KB of nested arrays in an `Any` field (Assignment.config) raise
  RecursionError; so does a deep value before the `type` key of a tagged union (skipped,
  recursively, while looking for the tag);
* how deep it gets before that depends on how much of the recursion limit the caller has
  already used, so the same payload may decode in one place and fail in another.

So the ipc layer sets its own bound, independent of the caller: first_too_deep() walks
the structure with an explicit stack of "items left in each open container" (no
recursion) and stops at the first container opened past the limit. It measures nesting
and nothing else; a payload that is truncated or holds a reserved byte ends the walk and
is left to the decoder, whose words for those problems are better.

The walk is one pass in C (ipc/native/depth.c, the GIL released meanwhile): a few ns per
item, so a 16 MB frame (frames.MAX_FRAME) built to be slow costs milliseconds. The
Python walk it replaces took 2-4 s on the same bytes (review).

The same walk also finds the first str item that is not UTF-8 (first_bad_string):
msgspec reports that in words that changed between its releases (0.23), so the
ipc layer checks it first and says it in its own (messages.decode, which has
both findings from one pass: scan).
"""
from sockherd.ipc._depth import MAX_LIMIT, first_too_deep, scan

__all__ = ["first_bad_string", "first_too_deep", "scan"]


def first_bad_string(payload) -> tuple[int, int] | None:
    """(offset, length) of the first str item whose bytes are not UTF-8, or None,
    among those before the walk ends: a truncation, a reserved byte, or a container
    deeper than MAX_LIMIT (1024) levels ends it, and what lies past is not looked at
    (decode refuses such a payload for its depth before asking)."""
    return scan(payload, MAX_LIMIT)[1]
