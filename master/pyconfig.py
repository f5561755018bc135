"""A settings file written in Python, as gunicorn reads its `-c
gunicorn.conf.py`: the file is run, and its module globals are the settings.

Which globals count: a name of ours or of gunicorn (master/gunicorn_names.py
says what a gunicorn name becomes) with a value that is not a module, a
class or a function; a function named after a hook (worker/hooks.py) makes
the file the hooks source. Every other global is the file's own business (an
`import os`, a helper variable, a helper function) and is left alone, as
gunicorn leaves it: a config computes its values (`workers =
multiprocessing.cpu_count() * 2 + 1`).

The file is run in the process that reads the settings (the master, `sockherd
check`, `ctl -c`) and again in each worker that loads its hooks: what its top
level does, it does each time.
"""
from __future__ import annotations

import os
import traceback
import types
from typing import Any

from sockherd.master.gunicorn_names import HOOKS, is_gunicorn_name


class PyConfigError(ValueError):
    """The file cannot be read or run (the message says where and why)."""


def looks_like_python(path: str) -> bool:
    return path.endswith(".py")


def run_file(path: str) -> dict[str, Any]:
    """The module globals of the Python file at path, after running it.
    Raises PyConfigError with the line that failed."""
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        raise PyConfigError(f"{path}: cannot read the settings file: {exc.strerror}") from None
    try:
        code = compile(source, path, "exec")
    except SyntaxError as exc:
        raise PyConfigError(f"{path}: not valid Python: {exc.msg} (line {exc.lineno})") from None
    ns: dict[str, Any] = {"__file__": os.path.abspath(path), "__name__": "__config__"}
    try:
        exec(code, ns)                    # noqa: S102 - the operator's own config, as gunicorn
    except BaseException as exc:          # noqa: BLE001 - anything the file does is its error
        where = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
        line = f" (line {where[-1].lineno})" if where else ""
        raise PyConfigError(f"{path}: running it raised {exc!r}{line}") from None
    return ns


def settings_of(path: str, known: set[str]) -> tuple[dict[str, Any], bool]:
    """(the globals of the file that are settings, whether it defines hooks).
    `known`: our keys and their aliases."""
    data: dict[str, Any] = {}
    hooks = False
    for name, value in run_file(path).items():
        if name.startswith("_"):
            continue
        if isinstance(value, types.FunctionType) and name in HOOKS:
            hooks = True
            continue
        if isinstance(value, (types.ModuleType, type)):
            continue
        if callable(value) and not is_gunicorn_name(name):
            continue                      # a helper function of the file's own
        if name in known or is_gunicorn_name(name):
            data[name] = list(value) if isinstance(value, tuple) else value
    return data, hooks
