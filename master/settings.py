"""Every setting of sockherd, read: the layers (file, environment, flags)
decoded and checked against the table (settings_table.py: each Setting's key,
flags, type with bounds, default and help), the final typed `Settings` struct,
the argparse options (`add_arguments`) and the docs (`docs_markdown`, kept in
docs/settings.md: `python -m sockherd.master.settings`).

Precedence: flag > environment > file > default. A bad value raises
SettingsError naming the source, the key, the value and the reason; the CLI
turns it into exit status 2 before anything binds or spawns.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal, Mapping

import msgspec

# the table, and what the rest of sockherd reads of it through this module
from sockherd.master.settings_table import (  # noqa: F401
    ALIASES, BY_KEY, ENV_PREFIX, SETTINGS, Setting,
)

Settings = msgspec.defstruct(
    "Settings",
    [(s.key, s.annotated, msgspec.field(default_factory=lambda d=s.default: d)
      if isinstance(s.default, list) else s.default) for s in SETTINGS],
    forbid_unknown_fields=True,
    frozen=True,
)
Settings.__doc__ = "The effective settings, every field typed and within its bounds."

# one layer (file, environment or flags): every key optional
_Layer = msgspec.defstruct(
    "_Layer",
    [(s.key, s.annotated | msgspec.UnsetType, msgspec.UNSET) for s in SETTINGS],
    forbid_unknown_fields=True,
)


class SettingsError(ValueError):
    """A setting that does not decode or validate; the message says where from,
    which key, which value and why."""


def _layer(values: Mapping[str, Any], source: str, *, strict: bool) -> dict[str, Any]:
    """Validates one layer; returns its set keys. strict=False lets strings
    from the environment and the command line become ints, floats, bools."""
    try:
        layer = msgspec.convert(dict(values), _Layer, strict=strict)
    except msgspec.ValidationError as exc:
        raise SettingsError(_explain(exc, values, source)) from None
    return {k: v for k in BY_KEY if (v := getattr(layer, k)) is not msgspec.UNSET}


def _explain(exc: msgspec.ValidationError, values: Mapping[str, Any], source: str) -> str:
    msg = str(exc)
    reason, _, where = msg.partition(" - at `$.")
    key = where.split("`")[0].split("[")[0] if where else ""
    if key in BY_KEY:
        s = BY_KEY[key]
        name = s.env if source == "environment" else (s.flags[0] if source == "command line" else key)
        if s.positional and source == "command line":
            name = s.metavar or key
        reason = reason[:1].lower() + reason[1:]
        allowed = getattr(s.type, "__args__", ()) if getattr(s.type, "__origin__", None) \
            is Literal else ()
        if allowed:
            reason += f" (allowed: {', '.join(allowed)})"
        return f"{source}: {name} = {values.get(key)!r}: {reason}"
    if msg.startswith("Object contains unknown field"):
        return f"{source}: {unknown(msg.split('`')[1])}"
    return f"{source}: {msg}"


def unknown(name: str) -> str:
    """What to say of a key that is no setting: the nearest known one first."""
    import difflib

    near = difflib.get_close_matches(name, [*BY_KEY, *ALIASES], n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return f"unknown setting {name!r}{hint} (known: {', '.join(BY_KEY)})"


def from_environment(env: Mapping[str, str]) -> dict[str, Any]:
    """The SOCKHERD_* variables of env; list settings are comma-separated."""
    return _traced_environment(env)[0]


def _traced_environment(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    raw: dict[str, Any] = {}
    names: dict[str, str] = {}
    for s in SETTINGS:
        for name in s.envs:
            if name in env:
                value = env[name]
                raw[s.key] = [v for v in value.split(",") if v] if s.is_list else value
                names[s.key] = name
    return _layer(raw, "environment", strict=False), names


def from_file(path: str, warnings: list[str] | None = None) -> dict[str, Any]:
    """A TOML file of top-level keys named as the settings (or gunicorn's
    names), or a Python file (`*.py`) whose module globals are, as gunicorn
    reads its config (master/settings_file.py)."""
    from sockherd.master import settings_file

    try:
        data, said = settings_file.read(path, ALIASES, set(BY_KEY),
                                        {s.key for s in SETTINGS if s.is_list})
    except settings_file.FileError as exc:
        raise SettingsError(str(exc)) from None
    if warnings is not None:
        warnings.extend(said)
    # a Python file's values are computed (often from the environment: "4")
    return _layer(data, path, strict=not path.endswith(".py"))


def add_arguments(parser) -> None:
    """Adds one option per setting to an argparse parser. Options default to
    SUPPRESS: only what was given reaches the flags layer."""
    import argparse

    for s in SETTINGS:
        kw: dict[str, Any] = {"help": s.help + (f" (env {s.env})"), "default": argparse.SUPPRESS}
        if s.positional:
            parser.add_argument(s.key, nargs="?", metavar=s.metavar, **kw)
            continue
        if s.is_bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif s.is_list:
            kw["action"] = "append"
        if s.metavar and not s.is_bool:
            kw["metavar"] = s.metavar
        parser.add_argument(*s.flags, dest=s.key, **kw)


def resolve(flags: Mapping[str, Any], env: Mapping[str, str] | None = None,
            config: str | None = None, cmd_args: Mapping[str, Any] | None = None) -> Any:
    """The effective Settings from the command line (flags: dest -> value, as
    argparse gives them), the environment and the settings file `config` (or
    $SOCKHERD_CONFIG). Raises SettingsError."""
    return traced(flags, env, config, cmd_args).settings


@dataclass
class Traced:
    """The settings, where each came from (`sockherd check --print-config`)
    and the warnings reading them gave."""
    settings: Any
    sources: dict[str, str]
    warnings: list[str]


def traced(flags: Mapping[str, Any], env: Mapping[str, str] | None = None,
           config: str | None = None, cmd_args: Mapping[str, Any] | None = None) -> Traced:
    """resolve(), with where each value came from. Layers, each over the one
    before: the defaults; WEB_CONCURRENCY and PORT (gunicorn's: they change
    the defaults of workers and bind); the file; the SOCKHERD_* variables;
    SOCKHERD_CMD_ARGS (cmd_args: parsed as the command line is, by cli.py);
    the command line."""
    env = os.environ if env is None else env
    merged: dict[str, Any] = {s.key: s.default for s in SETTINGS}
    sources = {s.key: "default" for s in SETTINGS}
    warnings: list[str] = []

    def over(layer: dict[str, Any], source) -> None:
        merged.update(layer)
        sources.update({k: source(k) if callable(source) else source for k in layer})

    gunicorn_env = {}
    if env.get("WEB_CONCURRENCY"):
        gunicorn_env["workers"] = env["WEB_CONCURRENCY"]
    if env.get("PORT"):
        gunicorn_env["bind"] = [f"0.0.0.0:{env['PORT']}"]
    try:
        layer = _layer(gunicorn_env, "environment", strict=False)
    except SettingsError as exc:
        raise SettingsError(str(exc).replace("SOCKHERD_WORKERS", "WEB_CONCURRENCY")
                            .replace("SOCKHERD_BIND", "PORT")) from None
    over(layer, {"workers": "env WEB_CONCURRENCY", "bind": "env PORT"}.get)
    path = config or env.get(ENV_PREFIX + "CONFIG")
    if path:
        over(from_file(path, warnings), f"file {path}")
    layer, names = _traced_environment(env)
    over(layer, lambda k: f"env {names[k]}")
    if cmd_args:
        over(_layer({k: v for k, v in cmd_args.items() if k in BY_KEY},
                    f"environment: {ENV_PREFIX}CMD_ARGS", strict=False),
             f"env {ENV_PREFIX}CMD_ARGS")
    over(_layer({k: v for k, v in flags.items() if k in BY_KEY}, "command line",
                strict=False), "cli")
    if merged.get("reload") and sources["reload_probation"] == "default":
        # development: a saved edit is what answers next (issue 36 §3: with a
        # probation the old code kept answering half the requests for 10 s)
        merged["reload_probation"] = 0.0
        sources["reload_probation"] = "default with --reload"
    settings = msgspec.convert(merged, Settings)
    _check_together(settings)
    return Traced(settings, sources, warnings)

def _check_together(s: Any) -> None:
    """Rules that tie several settings together, and values whose check
    belongs to their own module (addresses)."""
    from sockherd.master.addresses import AddressError, parse
    from sockherd.worker.identity import IdentityError, resolve

    for address in s.bind:
        try:
            parse(address)
        except AddressError as exc:
            raise SettingsError(f"bind: {exc}") from None
    if s.thread_groups > s.threads:
        raise SettingsError(f"thread_groups = {s.thread_groups}: more groups than threads "
                            f"({s.threads})")
    per_group = -(-s.threads // s.thread_groups)
    if per_group > 64:
        raise SettingsError(f"threads = {s.threads}: {per_group} threads per group, at most 64 "
                            f"(raise thread_groups)")
    try:
        resolve(s.user, s.group)
    except IdentityError as exc:
        raise SettingsError(str(exc)) from None
    from sockherd.worker.forwarded import ForwardedError, parse as parse_forwarded
    from sockherd.worker.proxy import check_allow

    try:
        check_allow(s.proxy_allow_from)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    try:
        parse_forwarded(s.forwarded_allow_ips, s.secure_scheme_headers, s.forwarder_headers)
    except ForwardedError as exc:
        raise SettingsError(str(exc)) from None
    from sockherd.master.tls import TlsError, check as check_tls

    try:
        check_tls(s)
    except TlsError as exc:
        raise SettingsError(str(exc)) from None
    if s.ws_per_message_deflate and not s.ws_max_size:
        raise SettingsError("ws_max_size = 0 (no limit) with ws_per_message_deflate: a "
                            "compressed message could inflate without bound (a 255 KiB one to "
                            "256 MiB); give ws_max_size a bound (default 16 MiB)")
    if isinstance(s.log_config, dict):
        _check_plain(s.log_config, "log_config", 0)
    for pair in s.raw_env:
        key, eq, _ = pair.partition("=")
        if not eq or not key or "\0" in pair:
            raise SettingsError(f"raw_env {pair!r}: KEY=VALUE (a variable's name, then =)")
    if s.heartbeat_timeout <= s.heartbeat_interval:
        raise SettingsError(f"heartbeat_timeout = {s.heartbeat_timeout}: must exceed "
                            f"heartbeat_interval ({s.heartbeat_interval})")


PLAIN = (str, int, float, bool, type(None))
# a dictConfig table nests four levels (handlers.NAME.KEY: a list or a
# table); the worker's message allows a config some twenty more (ipc)
PLAIN_DEPTH = 12


def _check_plain(value: Any, where: str, depth: int) -> None:
    """A log_config table reaches each worker as data (ipc: msgpack), so
    only plain values: what gunicorn's logconfig_dict may hold as live
    objects (a stream, a class) is spelled as dictConfig's strings here."""
    if depth > PLAIN_DEPTH:
        raise SettingsError(f"{where}: nested deeper than {PLAIN_DEPTH} levels")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise SettingsError(f"{where}: key {k!r} is not a string")
            _check_plain(v, f"{where}.{k}", depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_plain(v, f"{where}[{i}]", depth + 1)
    elif not isinstance(value, PLAIN):
        raise SettingsError(
            f"{where} = {value!r}: a {type(value).__name__}, but the table reaches each worker "
            f"as data: strings, numbers, booleans, lists and tables only (a stream is "
            f"'ext://sys.stderr', a class or factory its dotted name as a string)")


def docs_markdown() -> str:
    """The settings table of docs/settings.md."""
    rows = ["| key | flag | environment | default | what |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        flag = s.metavar if s.positional else ", ".join(f"`{f}`" for f in s.flags)
        default = ", ".join(s.default) if isinstance(s.default, list) else s.default
        default = f"`{default}`" if default != "" else "(none)"
        env = ", ".join(f"`{e}`" for e in (s.env,) + s.envs[:-1])
        rows.append(f"| `{s.key}` | {flag} | {env} | {default} | {s.help} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(docs_markdown(), end="")
