"""Our words for msgspec's validation errors.

msgspec words its errors as it likes, and a release may reword them (0.23 did for
invalid UTF-8, which nesting.first_bad_string now checks before msgspec sees a byte).
What a reader of our logs needs is which field is wrong; that part comes from msgspec's
path (`$.a.b`), the most stable thing it reports, and is said here in one shape of ours:

    unknown field `now`                       (in `$.options` when nested)
    missing field `pid`
    field `$.generation`: <msgspec's reason>

Text that matches none of these is passed on as it is, so a rewording in a later msgspec
loses no information; the drift job (`make drift`, docs/dependencies.md) shows it.

Known limit: msgspec quotes a field's name as it is, so a peer that names a top-level
field `` x` - at `$.listeners[0] `` gets the words of a nested one. The message is refused
all the same; only the log's "where" is the peer's (tests/ipc/test_ipc_wording.py).
"""
from __future__ import annotations

import re

# the path first, from the last " - at `$...`" (msgspec puts it at the end), then
# the named forms in what is left: a greedy name before an optional path group
# ran to the last backtick and never split the path off (review)
_AT = re.compile(r"^(.*) - at `(\$[^`]*)`$", re.S)
_NAMED = re.compile(r"^Object (contains unknown|missing required) field `(.*)`$", re.S)


def validation_words(text: str) -> str:
    """msgspec.ValidationError's text -> the same fact in our shape (above)."""
    at = _AT.match(text)
    reason, where = at.groups() if at else (text, None)
    named = _NAMED.match(reason)
    if named:
        kind, name = named.groups()
        what = "unknown" if kind.startswith("contains") else "missing"
        return f"{what} field `{name}`" + (f" in `{where}`" if where else "")
    if where:
        return f"field `{where}`: {reason}"
    return text
