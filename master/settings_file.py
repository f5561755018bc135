"""A settings file's contents, as raw key -> value for settings.py to
decode: TOML top-level keys, or a Python file's module globals
(master/pyconfig.py), gunicorn's names made ours (master/gunicorn_names.py),
the declared aliases made their keys, one string where a list is due made
that one item, and a Python file that defines hooks named as the hooks
source (`hooks`)."""
from __future__ import annotations

import os
import tomllib
from typing import Any, Mapping


class FileError(ValueError):
    """The file cannot be read, run or translated (the message says why)."""


def read(path: str, aliases: Mapping[str, str], keys: set[str],
         list_keys: set[str]) -> tuple[dict[str, Any], list[str]]:
    """(the raw settings of the file at path, warnings). aliases: alias ->
    key; keys: every setting's key; list_keys: the list settings'."""
    from sockherd.master import gunicorn_names, pyconfig

    known = keys | set(aliases)
    hooks = False
    try:
        if pyconfig.looks_like_python(path):
            data, hooks = pyconfig.settings_of(path, known)
        else:
            data = _toml(path)
        data, warnings = gunicorn_names.translate(data, path, known)
    except (pyconfig.PyConfigError, gunicorn_names.Refused) as exc:
        raise FileError(str(exc)) from None
    for alias, key in aliases.items():
        if alias in data:
            data.setdefault(key, data[alias])
            del data[alias]
    if hooks:
        if data.get("hooks"):
            raise FileError(f"{path}: defines hook functions and names hooks = "
                            f"{data['hooks']!r} too: keep one of them")
        data["hooks"] = os.path.abspath(path)
    for key in list_keys:
        # one string where a list is due is that one item (bind = "host:port")
        if isinstance(data.get(key), str):
            data[key] = [data[key]]
    return data, warnings


def _toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise FileError(f"{path}: cannot read the settings file: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise FileError(f"{path}: not valid TOML: {exc} (a Python config is read as "
                        f"Python when its name ends in .py)") from None
