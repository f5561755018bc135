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
"""
from __future__ import annotations

import re

_NAMED = re.compile(r"^Object (contains unknown|missing required) field `(.*)`"
                    r"(?: - at `(\$[^`]*)`)?$", re.S)
_AT = re.compile(r"^(.*) - at `(\$[^`]*)`$", re.S)


def validation_words(text: str) -> str:
    """msgspec.ValidationError's text -> the same fact in our shape (above)."""
    named = _NAMED.match(text)
    if named:
        kind, name, where = named.groups()
        what = "unknown" if kind.startswith("contains") else "missing"
        return f"{what} field `{name}`" + (f" in `{where}`" if where else "")
    at = _AT.match(text)
    if at:
        reason, where = at.groups()
        return f"field `{where}`: {reason}"
    return text
