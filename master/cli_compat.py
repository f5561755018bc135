"""gunicorn's and uvicorn's command-line flags, read as they mean there
(issue 36 §5): a command line copied from a gunicorn or uvicorn unit runs
unchanged where its meaning is ours, and gets one line saying what to do
where it is not, never argparse's usage dump.

`rewrite(argv)` turns the flags below into ours before argparse sees them;
our own flags (settings_table.py: `-w`, `-b`, `--threads`, `-t/--timeout`,
`--keep-alive`, `--graceful-timeout`, `-n/--name`, `-e/--env`...) are
gunicorn's already and pass as they are. What each flag becomes is the
table `docs_markdown()` prints for docs/settings.md (a test keeps them equal).
"""
from __future__ import annotations

from dataclasses import dataclass

from sockherd.master.gunicorn_names import ASGI_WORKERS, HARMLESS, UNSUPPORTED


class FlagError(ValueError):
    """A flag of gunicorn's or uvicorn's we cannot honour (one line: why,
    and what to do instead)."""


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]   # the flag as gunicorn or uvicorn spells it
    server: str              # "gunicorn" or "uvicorn"
    value: bool              # takes a value
    ours: str                # our flag it becomes ("" for the kinds below)
    kind: str = "same"       # same | warn (dropped, said) | refuse | special
    why: str = ""            # said for warn and refuse; the README's "becomes" otherwise


def _warn(names, server, value, why):
    return Flag(names, server, value, "", "warn", why)


def _refuse(names, server, value, why):
    return Flag(names, server, value, "", "refuse", why)


FLAGS = (
    # gunicorn: its settings that change nothing here (gunicorn_names.HARMLESS)
    _warn(("--preload",), "gunicorn", False, HARMLESS["preload_app"]),
    _warn(("--worker-tmp-dir",), "gunicorn", True, HARMLESS["worker_tmp_dir"]),
    _warn(("--capture-output",), "gunicorn", False, HARMLESS["capture_output"]),
    _warn(("-R", "--enable-stdio-inheritance"), "gunicorn", False,
          HARMLESS["enable_stdio_inheritance"]),
    _warn(("--reuse-port",), "gunicorn", False, HARMLESS["reuse_port"]),
    _warn(("--no-sendfile",), "gunicorn", False, HARMLESS["sendfile"]),
    _warn(("--worker-connections",), "gunicorn", True, HARMLESS["worker_connections"]),
    _refuse(("-D", "--daemon"), "gunicorn", False, UNSUPPORTED["daemon"]),
    _refuse(("--paste", "--paster"), "gunicorn", True, "name the WSGI callable (MODULE:APP)"),
    _refuse(("--statsd-host",), "gunicorn", True, UNSUPPORTED["statsd_host"]),
    _refuse(("--log-syslog",), "gunicorn", False, "log to stderr or --error-logfile"),
    Flag(("--log-file",), "gunicorn", True, "--error-logfile"),
    Flag(("--access-logformat",), "gunicorn", True, "--access-log-format"),
    Flag(("--reload-extra-file",), "gunicorn", True, "--reload-extra-files"),
    Flag(("-u",), "gunicorn", True, "--user"),
    Flag(("-g",), "gunicorn", True, "--group"),
    Flag(("--check-config",), "gunicorn", False, "", "special", "`sockherd check`"),
    # uvicorn
    Flag(("--host",), "uvicorn", True, "", "special",
         "`-b HOST:PORT` (with --port; uvicorn's defaults 127.0.0.1 and 8000)"),
    Flag(("--port",), "uvicorn", True, "", "special", "`-b HOST:PORT` (with --host)"),
    Flag(("--uds",), "uvicorn", True, "", "special", "`-b unix:PATH`"),
    Flag(("--fd",), "uvicorn", True, "", "special", "`-b fd://N`"),
    Flag(("--timeout-keep-alive",), "uvicorn", True, "--keepalive-timeout"),
    Flag(("--timeout-graceful-shutdown",), "uvicorn", True, "--hard-stop-after"),
    Flag(("--limit-max-requests",), "uvicorn", True, "--max-requests"),
    Flag(("--app-dir",), "uvicorn", True, "--pythonpath"),
    Flag(("--ssl-certfile",), "uvicorn", True, "--certfile"),
    Flag(("--ssl-keyfile",), "uvicorn", True, "--keyfile"),
    Flag(("--ssl-keyfile-password",), "uvicorn", True, "--keyfile-password"),
    Flag(("--ssl-ca-certs",), "uvicorn", True, "--ca-certs"),
    Flag(("--ssl-ciphers",), "uvicorn", True, "--ciphers"),
    Flag(("--ws-per-message-deflate",), "uvicorn", True, "", "special",
         "`--ws-per-message-deflate` / `--no-ws-per-message-deflate` (uvicorn's takes "
         "true/false; ours is off by default, uvicorn's on)"),
    Flag(("--proxy-headers",), "uvicorn", False, "", "special",
         "on by default: the forwarding headers of forwarded_allow_ips's peers are believed"),
    Flag(("--no-proxy-headers",), "uvicorn", False, "", "special",
         "`--forwarded-allow-ips ''` (no peer believed)"),
    _warn(("--loop",), "uvicorn", True, "the engine runs its own asyncio loops"),
    _warn(("--http",), "uvicorn", True, "HTTP/1.1 is the engine's own (C, llhttp)"),
    _warn(("--ws",), "uvicorn", True, "WebSockets are the engine's own (C)"),
    _warn(("--h11-max-incomplete-event-size",), "uvicorn", True,
          "the head's bounds are --limit-request-line and --limit-request-field-size"),
    _warn(("--use-colors", "--no-use-colors"), "uvicorn", False, "log lines are plain"),
    _refuse(("--env-file",), "uvicorn", True,
            "give the variables with -e KEY=VALUE, or set them in the unit's environment"),
    _refuse(("--limit-concurrency",), "uvicorn", True,
            "--max-connections bounds a worker's connections (accepting pauses; uvicorn "
            "answers 503)"),
)
_BY_NAME = {name: f for f in FLAGS for name in f.names}
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def rewrite(argv: list[str]) -> tuple[list[str], list[str]]:
    """argv with gunicorn's and uvicorn's flags made ours: (argv, warnings).
    Raises FlagError for one we cannot honour."""
    out: list[str] = []
    warnings: list[str] = []
    host = port = None
    i = 0
    while i < len(argv):
        word = argv[i]
        name, eq, inline = word.partition("=") if word.startswith("--") else (word, "", "")
        if word.startswith("-k") and len(word) > 2:
            # argparse's (so gunicorn's) attached forms: -kCLASS, -k=CLASS
            name, eq, inline = "-k", "=", word[3:] if word[2] == "=" else word[2:]
        if name in ("-k", "--worker-class") and (eq or i + 1 < len(argv)):
            kind = inline if eq else argv[i + 1]
            if kind in ASGI_WORKERS:
                warnings.append(f"gunicorn's {name} {kind}: served as --interface asgi "
                                f"(the engine is the ASGI server)")
                out += ["--interface", "asgi"]
                i += 1 if eq else 2
                continue
        flag = _BY_NAME.get(name)
        if name == "--ws-per-message-deflate" and not eq and (
                i + 1 >= len(argv) or argv[i + 1].lower() not in TRUE + FALSE):
            flag = None                   # ours, a flag with no value: as it is
        if flag is None or word == "--":
            if word == "--":
                out.extend(argv[i:])
                break
            out.append(word)
            i += 1
            continue
        value = None
        if flag.value:
            if eq:
                value = inline
            elif i + 1 < len(argv):
                value = argv[i + 1]
                i += 1
            else:
                raise FlagError(f"{name}: expects a value")
        i += 1
        said = f"{flag.server}'s {name}"
        if flag.kind == "warn":
            warnings.append(f"{said} is ignored: {flag.why}")
        elif flag.kind == "refuse":
            raise FlagError(f"{said} is not supported by sockherd: {flag.why}")
        elif flag.kind == "same":
            out += [flag.ours, value] if flag.value else [flag.ours]
        elif name == "--host":
            host = value
        elif name == "--port":
            port = value
        elif name == "--uds":
            out += ["-b", f"unix:{value}"]
        elif name == "--fd":
            out += ["-b", f"fd://{value}"]
        elif name == "--ws-per-message-deflate":
            if value.lower() not in TRUE + FALSE:
                raise FlagError(f"{said} {value!r}: true or false")
            out.append("--ws-per-message-deflate" if value.lower() in TRUE
                       else "--no-ws-per-message-deflate")
        elif name == "--no-proxy-headers":
            out += ["--forwarded-allow-ips", ""]
        elif name == "--check-config":
            if "run" in out:
                out[out.index("run")] = "check"
        # --proxy-headers: what we do already
    if host is not None or port is not None:
        host = host or "127.0.0.1"
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        out += ["-b", f"{host}:{port or 8000}"]
    return out, warnings


def docs_markdown() -> str:
    """docs/settings.md's table: each of these flags and what it becomes."""
    rows = ["| flag | of | here |", "|---|---|---|"]
    for f in FLAGS:
        names = ", ".join(f"`{n}`" for n in f.names)
        if f.kind == "same":
            here = f"`{f.ours}`"
        elif f.kind == "warn":
            here = f"ignored, with a warning: {f.why}"
        elif f.kind == "refuse":
            here = f"refused: {f.why}"
        else:
            here = f.why
        rows.append(f"| {names} | {f.server} | {here} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(docs_markdown(), end="")
