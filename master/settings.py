"""Every setting of sockherd, declared once.

Each Setting names its key (TOML and attribute), its command-line flags, its type
with bounds, its default and its help. From that one table come: the argparse
options (`add_arguments`), the `SOCKHERD_<KEY>` environment variables, the TOML
decoding, the final typed `Settings` struct and the docs (`docs_markdown`, kept
in the README). msgspec does every type and bound check: no hand-written ones.

Precedence: flag > environment > file > default. A bad value raises
SettingsError naming the source, the key, the value and the reason; the CLI
turns it into exit status 2 before anything binds or spawns.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Mapping

import msgspec

ENV_PREFIX = "SOCKHERD_"


@dataclass(frozen=True)
class Setting:
    key: str
    flags: tuple[str, ...]
    type: Any
    default: Any
    help: str
    meta: msgspec.Meta | None = None
    metavar: str | None = None
    section: str = "server"
    positional: bool = field(default=False)
    # former keys still read (file and environment; their flags are in
    # flags), for a renamed setting the README documented
    aliases: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def envs(self) -> tuple[str, ...]:
        """The environment variables read, the alias ones first (the
        setting's own name wins when both are set)."""
        return tuple(ENV_PREFIX + a.upper() for a in self.aliases) + (self.env,)

    @property
    def annotated(self) -> Any:
        return Annotated[self.type, self.meta] if self.meta else self.type

    @property
    def is_list(self) -> bool:
        return getattr(self.type, "__origin__", None) is list

    @property
    def is_bool(self) -> bool:
        return self.type is bool


def _seconds(lo: float, hi: float) -> msgspec.Meta:
    return msgspec.Meta(ge=lo, le=hi)


SETTINGS: tuple[Setting, ...] = (
    Setting("app", ("app",), str, "", "the app, `module:callable`; empty: the embedded status page",
            msgspec.Meta(pattern=r"^$|^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"), "MODULE:CALLABLE",
            section="app", positional=True),
    Setting("interface", ("--interface",), Literal["auto", "asgi", "wsgi", "stream"], "auto",
            "how the app is called: `asgi` (ASGI 3; an ASGI 2 app is wrapped), `wsgi` (PEP 3333) "
            "or `stream` (a handler class); `auto`: found out from the app (worker/interface.py), "
            "an explicit one the app contradicts is refused at start", section="app"),
    # uvicorn's names and meanings; no timeout of its own: the startup is
    # bounded by ready_timeout (the worker is not READY before it ends), the
    # shutdown by the drain's deadline (hard_stop_after)
    Setting("lifespan", ("--lifespan",), Literal["auto", "on", "off"], "auto",
            "ASGI lifespan: `on`: startup must complete before the worker is ready (a failure "
            "stops it); `auto`: the same, but an app that rejects the lifespan scope is served "
            "without it; `off`: never sent", section="app"),
    Setting("chdir", ("--chdir",), str, "", "directory to change to before importing the app",
            metavar="DIR", section="app"),
    Setting("pythonpath", ("--pythonpath",), list[str], [],
            "directories put first on sys.path before importing the app (repeatable)",
            metavar="DIR", section="app"),
    Setting("workers", ("-w", "--workers"), int, 0,
            "worker processes; 0: one per CPU", msgspec.Meta(ge=0, le=1024), "N", section="workers"),
    Setting("threads", ("-t", "--threads"), int, 1,
            "threads per worker; more pay off only for apps that block (the GIL)",
            msgspec.Meta(ge=1, le=1024), "N", section="workers"),
    Setting("thread_groups", ("--thread-groups",), int, 1,
            "thread groups per worker (at most 64 threads a group)",
            msgspec.Meta(ge=1, le=32), "G", section="workers"),
    Setting("bind", ("-b", "--bind"), list[str], ["127.0.0.1:8000"],
            "address to listen on: `host:port`, `[v6]:port`, `unix:/path`, `fd://N`, `systemd:NAME` (a socket-activated one; repeatable)",
            msgspec.Meta(min_length=1), "ADDRESS", section="listeners"),
    Setting("backlog", ("--backlog",), int, 2048, "listen() backlog of each bound socket",
            msgspec.Meta(ge=1, le=65535), "N", section="listeners"),
    Setting("unix_mode", ("--unix-mode",), str, "0660", "file mode of bound unix sockets (octal)",
            msgspec.Meta(pattern=r"^0?[0-7]{3}$"), "MODE", section="listeners"),
    Setting("unix_owner", ("--unix-owner",), str, "", "`user[:group]` owning bound unix sockets",
            metavar="USER[:GROUP]", section="listeners"),
    Setting("user", ("--user",), str, "", "user the workers run as (the master keeps its own)",
            metavar="USER", section="workers"),
    Setting("group", ("--group",), str, "", "group the workers run as", metavar="GROUP",
            section="workers"),
    # liveness: a stopped (SIGSTOP) or wedged worker is killed within
    # heartbeat_timeout, its connections with it, and respawned (issue 19
    # §10: at 25 s / 75 s one held its connections for over a minute). 15 s
    # is three heartbeats missed in a row (HAProxy marks a server down after
    # `fall 3` checks, 2 s apart by default); half gunicorn's --timeout 30,
    # which also counts a request's own time: ours is only the main
    # thread's, which never waits on requests. Cost: each heartbeat wakes its
    # worker and the master once: 2 x 0.2/s per idle worker, plus the
    # master's check (once per timeout at most). At 25 s it was 0.17/s for
    # master + 2 idle workers (bench/RESULTS.md).
    Setting("heartbeat_interval", ("--heartbeat-interval",), float, 5.0,
            "seconds between a worker's heartbeats to the master",
            _seconds(0.1, 3600), "S",
            section="supervision"),
    Setting("heartbeat_timeout", ("--heartbeat-timeout",), float, 15.0,
            "a worker silent this long (stopped, wedged, its channel broken) is killed and "
            "respawned", _seconds(0.5, 86400), "S",
            section="supervision"),
    Setting("ready_timeout", ("--ready-timeout",), float, 60.0,
            "a new worker not READY after this long has failed", _seconds(0.5, 86400), "S",
            section="supervision"),
    Setting("reload_probation", ("--reload-probation",), float, 10.0,
            "after a reload's new generation is READY, the old one serves beside it this long "
            "and drains only then; a new worker that crashes meanwhile rolls the reload back "
            "(the old generation serves on, the reload fails with why); `ctl reload` answers "
            "when it is over; 0: the old generation drains at once", _seconds(0, 3600), "S",
            section="supervision"),
    Setting("max_requests", ("--max-requests",), int, 0,
            "a worker that served this many requests is replaced (the new one READY first, "
            "then the old drained); 0: never", msgspec.Meta(ge=0, le=2**40), "N",
            section="supervision"),
    Setting("max_requests_jitter", ("--max-requests-jitter",), int, 0,
            "up to this many requests added at random to max_requests per worker, so that "
            "workers are not all replaced at once", msgspec.Meta(ge=0, le=2**40), "N",
            section="supervision"),
    Setting("max_worker_lifetime", ("--max-worker-lifetime",), float, 0.0,
            "a worker serving for this long is replaced the same way; 0: never",
            _seconds(0, 10 * 365 * 86400), "S", section="supervision"),
    Setting("handoff_socket", ("--handoff-socket",), str, "",
            "a unix socket path where this master hands its listeners to a new instance "
            "started with `run --takeover PATH`; empty: none", metavar="PATH",
            section="supervision"),
    Setting("python", ("--python",), str, "",
            "the interpreter an upgrade (USR2) re-executes the master with (a new venv, a new "
            "Python); empty: the one running", metavar="PATH", section="supervision"),
    Setting("hard_stop_after", ("--hard-stop-after",), float, 30.0,
            "a draining worker still busy after this long is killed", _seconds(0, 86400), "S",
            section="supervision"),
    Setting("unready_delay", ("--unready-delay",), float, 0.0,
            "on a graceful stop (TERM, `ctl stop`), the readiness endpoint turns unready at once "
            "and the listeners are served on for this long, so that a balancer's health check "
            "stops sending before the drain starts (lame duck); 0: drain at once",
            _seconds(0, 3600), "S", section="supervision"),
    Setting("idle_grace", ("--idle-grace",), float, 1.0,
            "while draining, an idle connection is closed after staying idle this long, and a "
            "connection queued at the drain's start that no loop thread takes this long is "
            "refused (503)",
            _seconds(0, 3600), "S", section="supervision"),
    Setting("takeover_after", ("--takeover-after",), float, 0.5,
            "connections of a thread stuck this long in one handler move to an idle thread",
            _seconds(0.001, 3600), "S", section="workers"),
    # gunicorn's names and defaults; every byte before the body counts
    # toward one of them (worker/native/httpparse.h)
    Setting("limit_request_line", ("--limit-request-line",), int, 4094,
            "longest request line, CRLF excluded, empty lines before it included (longer: 414)",
            msgspec.Meta(ge=64, le=1 << 20), "BYTES", section="http"),
    Setting("limit_request_field_size", ("--limit-request-field-size",
                                         "--limit-request-header-bytes"), int, 8190,
            "longest header or trailer field line, its CRLF included, as gunicorn counts (longer: 431); "
            "limit_request_header_bytes is its former name",
            msgspec.Meta(ge=1, le=1 << 20), "BYTES", section="http",
            aliases=("limit_request_header_bytes",)),
    Setting("limit_request_fields", ("--limit-request-fields",), int, 100,
            "most header and trailer fields in a request (more: 431)",
            msgspec.Meta(ge=1, le=32768), "N", section="http"),
    Setting("limit_request_body", ("--limit-request-body",), int, 0,
            "largest request body, chunk extensions and size padding included; "
            "0: no limit (larger: 413)",
            msgspec.Meta(ge=0), "BYTES", section="http"),
    Setting("body_timeout", ("--body-timeout",), float, 30.0,
            "a request body must arrive within this long (a second more per 64 KiB "
            "received): one read in the loop (body_buffer) is then refused 408, an app "
            "reading a streamed one gets an error; a response its client takes nothing of "
            "for this long is cut (the connection closes)",
            _seconds(0.1, 3600), "S", section="http"),
    # issue 23: uvicorn's --ws-max-size and its default
    Setting("ws_max_size", ("--ws-max-size",), int, 16 << 20,
            "ASGI WebSockets: the largest message (its fragments together) a client may "
            "send; a larger one closes the WebSocket with 1009; 0: no limit",
            msgspec.Meta(ge=0), "BYTES", section="http"),
    # nginx's client_body_buffer_size, larger than its 16 KiB default: most
    # form posts and JSON bodies fit, and a body read in the loop costs no
    # thread while its client is slow (issue 21); past it a body streams
    Setting("body_buffer", ("--body-buffer",), int, 1 << 20,
            "a request body up to this size is read whole before the app runs, without "
            "holding a thread while the client sends it (a larger one streams to the app "
            "through wsgi.input); 0: every body still arriving streams",
            msgspec.Meta(ge=0), "BYTES", section="http"),
    Setting("header_timeout", ("--header-timeout",), float, 15.0,
            "a request head must arrive whole within this long of its first byte (or of the "
            "connection): 408 and close (slowloris)", _seconds(0.1, 3600), "S", section="http"),
    Setting("keepalive_timeout", ("--keepalive-timeout",), float, 75.0,
            "an idle kept-alive connection is closed after this long (longer than the idle "
            "pools of common load balancers, as nginx); 0: never", _seconds(0, 86400), "S",
            section="http"),
    Setting("max_connections", ("--max-connections",), int, 10000,
            "open connections per worker beyond which it stops accepting; 0: no cap",
            msgspec.Meta(ge=0), "N", section="http"),
    Setting("stream_output_limit", ("--stream-output-limit",), int, 16 << 20,
            "a stream connection with more output than this waiting for its client is closed "
            "(its output dropped, a log line): what bounds a handler that ignores "
            "pause_writing", msgspec.Meta(ge=1 << 16, le=1 << 40), "BYTES", section="workers"),
    Setting("root_path", ("--root-path",), str, "",
            "SCRIPT_NAME: the path prefix the app is mounted at (e.g. /app)",
            msgspec.Meta(pattern=r"^$|^/.*[^/]$"), "PATH", section="http"),
    Setting("server_header", ("--server-header",), str, "",
            "the Server header of responses; empty: none", metavar="TEXT", section="http"),
    Setting("access_log", ("--access-log",), bool, False,
            "log one line per HTTP request (logger sockherd.access, to stderr)",
            section="logging"),
    Setting("access_log_format", ("--access-log-format",), str,
            '%(h)s - - [%(t)s] "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s" %(L)s',
            "access log line, gunicorn's atoms: h t r m U q H s b f a L D p",
            metavar="FORMAT", section="logging"),
    Setting("runtime_dir", ("--runtime-dir",), str, "",
            "where the control sockets live (created 0700); empty: $XDG_RUNTIME_DIR/sockherd, "
            "else /run/sockherd as root, else a per-user directory under the temp dir",
            metavar="DIR", section="control"),
    Setting("control", ("--control",), str, "",
            "the control endpoint (`sockherd ctl`): empty: ipc://RUNTIME_DIR/control; a "
            "tcp:// endpoint needs control_curve_secret and control_curve_clients; `off`: none",
            metavar="ENDPOINT", section="control"),
    Setting("control_curve_secret", ("--control-curve-secret",), str, "",
            "the control server's CURVE key pair (a zmq secret certificate file, as "
            "zmq.auth.create_certificates writes)", metavar="FILE", section="control"),
    Setting("control_curve_clients", ("--control-curve-clients",), str, "",
            "a directory of the public certificates of the clients allowed on a tcp:// control "
            "endpoint", metavar="DIR", section="control"),
    Setting("metrics", ("--metrics",), str, "",
            "host:port of a Prometheus metrics listener (/metrics) with the status page at "
            "/-/status; empty: none", metavar="HOST:PORT", section="control"),
    Setting("log_level", ("--log-level",), Literal["debug", "info", "warning", "error"], "info",
            "least severe level logged (to stderr)", section="logging"),
)

BY_KEY = {s.key: s for s in SETTINGS}
ALIASES = {a: s.key for s in SETTINGS for a in s.aliases}

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
        return f"{source}: {name} = {values.get(key)!r}: {reason}"
    if msg.startswith("Object contains unknown field"):
        unknown = msg.split("`")[1]
        return f"{source}: unknown setting {unknown!r} (known: {', '.join(BY_KEY)})"
    return f"{source}: {msg}"


def from_environment(env: Mapping[str, str]) -> dict[str, Any]:
    """The SOCKHERD_* variables of env; list settings are comma-separated."""
    raw: dict[str, Any] = {}
    for s in SETTINGS:
        for name in s.envs:
            if name in env:
                value = env[name]
                raw[s.key] = [v for v in value.split(",") if v] if s.is_list else value
    return _layer(raw, "environment", strict=False)


def from_file(path: str) -> dict[str, Any]:
    """A TOML file of top-level keys, named as the settings."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read the settings file: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: not valid TOML: {exc}") from None
    for alias, key in ALIASES.items():
        if alias in data:
            data.setdefault(key, data[alias])
            del data[alias]
    return _layer(data, path, strict=True)


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
            config: str | None = None) -> Any:
    """The effective Settings from the command line (flags: dest -> value, as
    argparse gives them), the environment and the TOML file `config` (or
    $SOCKHERD_CONFIG). Raises SettingsError."""
    env = os.environ if env is None else env
    merged: dict[str, Any] = {s.key: s.default for s in SETTINGS}
    path = config or env.get(ENV_PREFIX + "CONFIG")
    if path:
        merged.update(from_file(path))
    merged.update(from_environment(env))
    merged.update(_layer({k: v for k, v in flags.items() if k in BY_KEY}, "command line",
                         strict=False))
    settings = msgspec.convert(merged, Settings)
    _check_together(settings)
    return settings


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
    if s.heartbeat_timeout <= s.heartbeat_interval:
        raise SettingsError(f"heartbeat_timeout = {s.heartbeat_timeout}: must exceed "
                            f"heartbeat_interval ({s.heartbeat_interval})")


def docs_markdown() -> str:
    """The settings table for the README."""
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
