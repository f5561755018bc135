"""The control commands: one module each, one definition each, shared by
the master (which runs it) and `sockherd ctl` (which parses its arguments
and prints its answer). circus's commands/ is the model.

A command module defines COMMAND = Command(...):
  name     the words a user types ("show proc")
  help     one line
  args     a msgspec Struct of its typed arguments (decoded strictly from
           the request; the CLI builds its argument parser from the fields:
           a field without a default is positional, one with a default is an
           option, a bool a flag)
  run      run(sup, args, reply) in the master's loop: reply.ok(result) or
           reply.fail(why), now or later; an exception it raises becomes a
           failure reply naming the command, never a traceback to the client
  render   render(result) -> text, the CLI's table (--json prints the result)
  timeout  how long the CLI waits by default
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any, Callable

import msgspec

log = logging.getLogger("sockherd.master")

MODULES = ("status", "show_proc", "show_activity", "show_fd", "reload", "upgrade", "drain",
           "scale", "stop", "watch", "help")


class NoArgs(msgspec.Struct, forbid_unknown_fields=True):
    pass


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    run: Callable
    render: Callable[[Any], str]
    args: type = NoArgs
    timeout: float = 10.0


def _load() -> dict[str, Command]:
    out = {}
    for name in MODULES:
        cmd = importlib.import_module(f"{__name__}.{name}").COMMAND
        out[cmd.name] = cmd
    return out


def dispatch(sup, req, reply) -> None:
    """One request (ipc.control.Request) to its command; every error is a
    reply that says what was wrong."""
    cmd = COMMANDS.get(req.command)
    if cmd is None:
        reply.fail(f"unknown command {req.command!r}; the commands: "
                   f"{', '.join(sorted(COMMANDS))}")
        return
    try:
        args = msgspec.convert(req.args, cmd.args)
    except msgspec.ValidationError as exc:
        reply.fail(f"{cmd.name}: bad arguments: {exc}")
        return
    try:
        cmd.run(sup, args, reply)
    except Exception as exc:                      # noqa: BLE001 - said to the client
        log.exception("control: %s failed", cmd.name)
        reply.fail(f"{cmd.name}: internal error: {type(exc).__name__}: {exc}")


def table(rows: list[dict], columns: list[str]) -> str:
    """A plain text table: a header and one line per row, columns padded."""
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def duration(value) -> str:
    """Seconds as the tables and the status page show them: with a unit."""
    if value is None:
        return "?"
    value = float(value)
    if value < 120:
        return f"{value:.1f}s"
    if value < 7200:
        return f"{value / 60:.1f}min"
    if value < 172800:
        return f"{value / 3600:.1f}h"
    return f"{value / 86400:.1f}d"


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def find_worker(sup, name: str):
    """The live slot named GEN.INDEX or by pid; ValueError saying why not."""
    live = [s for s in sup._live() if s.proc is not None]
    for slot in live:
        if name in (f"{slot.generation}.{slot.index}", str(slot.proc.pid)):
            return slot
    raise ValueError(f"no live worker {name!r} (workers: "
                     f"{', '.join(f'{s.generation}.{s.index}' for s in live) or 'none'})")


COMMANDS = _load()           # last: the command modules import the helpers above
