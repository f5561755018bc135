"""The stream interface's parts (worker/stream*.py, split from one 686-line
stream.py along its concepts): Connection is built on StreamOutput and
StreamProxyHeader, both built on StreamCore, and no part calls a method of
a part above it (the split's rule: no file calls back up into the one that
calls it). Checked on the code: every `self.<name>` a part's class uses
that is a method of another part must be of the same part or one below.
And the parts add no instance dict: every base keeps `__slots__ = ()`, so
a connection stays as small as the one class was (a base without it gives
each Connection a __dict__)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sockherd.worker.stream import Connection

pytestmark = pytest.mark.timeout(60)

WORKER = Path(__file__).resolve().parents[2] / "worker"
# each part and the parts it may call (itself included)
PARTS = {
    "stream_core": {"stream_core"},
    "stream_output": {"stream_core", "stream_output"},
    "stream_proxy": {"stream_core", "stream_proxy"},
    "stream": {"stream_core", "stream_output", "stream_proxy", "stream"},
}


def _methods_and_uses():
    defined: dict[str, str] = {}
    uses: dict[str, set[str]] = {}
    for part in PARTS:
        tree = ast.parse((WORKER / f"{part}.py").read_text())
        uses[part] = set()
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef):
                    assert fn.name not in defined, f"{fn.name} defined in two parts"
                    defined[fn.name] = part
            uses[part] |= {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute)
                           and isinstance(n.value, ast.Name) and n.value.id == "self"}
    return defined, uses


def test_no_stream_part_calls_a_part_above_it():
    defined, uses = _methods_and_uses()
    upward = sorted(f"{part}.py uses self.{name} of {defined[name]}.py"
                    for part, names in uses.items() for name in names
                    if name in defined and defined[name] not in PARTS[part])
    assert not upward, "calls up the stream parts:\n" + "\n".join(upward)
    # the check sees the uses at all: the output and the proxy header call the core
    assert "_sync" in uses["stream_output"] and defined["_sync"] == "stream_core"
    assert "connect" in uses["stream_proxy"] and defined["connect"] == "stream_core"


def test_a_connection_has_no_instance_dict():
    assert Connection.__dictoffset__ == 0
    for base in Connection.__mro__[1:-1]:
        assert base.__dict__.get("__slots__") == (), base
