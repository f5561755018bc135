"""gunicorn's setting names in a settings file (TOML or a gunicorn-style
Python file): what each one becomes here.

A gunicorn config moves over unchanged when every name it sets either is a
setting of ours (the same name and meaning: bind, workers, threads,
max_requests, limit_request_line...), is declared as an alias of one
(settings_table.py `aliases`: graceful_timeout, keepalive, loglevel, wsgi_app), is
translated below (accesslog, errorlog, logconfig_json, logconfig_dict; a dict of
secure_scheme_headers; cert_reqs given as ssl.CERT_*), or does nothing here that it would
do there (HARMLESS: a warning, the value dropped). Any other gunicorn
setting is refused naming it, with what to do instead: silently ignoring
`ssl_context` would serve something else than what was asked for. A gunicorn
setting given a false value (None, False, "", 0, an empty list) asks for
nothing and is dropped without a word: that is how gunicorn configs spell
"off" (`daemon = False`, `certfile = None`).
"""
from __future__ import annotations

from typing import Any

# the hooks we call (worker/hooks.py says when, with what)
HOOKS = ("on_starting", "when_ready", "on_reload", "on_exit", "post_worker_init",
         "worker_exit", "child_exit", "pre_request", "post_request")

# gunicorn's cert_reqs is Python's ssl.CERT_* number
CERT_REQS = {0: "none", 1: "optional", 2: "required"}
TLS_NAMES = ("certfile", "keyfile", "ca_certs", "cert_reqs", "ciphers")

# gunicorn settings that change nothing here: the value is dropped with a warning
HARMLESS = {
    "preload_app": "each worker imports the app itself (a reload starts new workers anyway)",
    "sendfile": "sendfile(2) is used for wsgi.file_wrapper whenever the file allows",
    "reuse_port": "the workers share the master's listening socket",
    "default_proc_name": "process titles are set by sockherd",
    "worker_tmp_dir": "liveness is a heartbeat over the worker's channel, no temp file",
    "worker_connections": "max_connections bounds the connections of a worker",
    "tmp_upload_dir": "gunicorn itself does not use it",
    "capture_output": "the workers' stdout and stderr are the master's",
    "enable_stdio_inheritance": "the workers' stdout and stderr are the master's",
    "disable_redirect_access_to_syslog": "there is no syslog output",
    "check_config": "use `sockherd check`",
    "print_config": "use `sockherd check --print-config`",
    # hooks of gunicorn's fork model: ours exec each worker, nothing is
    # inherited from the master that a fork hook would have to fix up
    "pre_fork": "never called: workers are started with exec, not forked",
    "post_fork": "never called: workers are started with exec, not forked "
                 "(post_worker_init runs in each worker)",
    "pre_exec": "never called: an upgrade (USR2) re-executes the master in place",
    "worker_int": "never called: a worker ignores INT (the master stops it)",
    "worker_abort": "never called: a request past `timeout` is logged with its stack",
    "nworkers_changed": "never called",
}

# gunicorn settings with no counterpart yet: refused when set to a true value
UNSUPPORTED = {
    "reload_engine": "", "spew": "",
    "daemon": "run it under systemd, a container runtime or a supervisor instead",
    "initgroups": "", "pythonpath_append": "",
    "header_map": "", "strip_header_spaces": "", "permit_obsolete_folding": "",
    "permit_unconventional_http_method": "", "permit_unconventional_http_version": "",
    "casefold_http_method": "",
    "logger_class": "", "logconfig": "use log_config (a dictConfig file, TOML or JSON)",
    "syslog": "", "syslog_addr": "", "syslog_prefix": "", "syslog_facility": "",
    "statsd_host": "use --metrics (Prometheus) instead", "dogstatsd_tags": "",
    "statsd_prefix": "",
    "paste": "", "raw_paste_global_conf": "",
    # certfile, keyfile, ca_certs, cert_reqs, ciphers are ours (settings_table.py)
    "ssl_context": "set certfile, keyfile, ca_certs, cert_reqs, ciphers, ssl_min_version",
    "ssl_version": "use ssl_min_version (TLSv1.2 or TLSv1.3)",
    "suppress_ragged_eofs": "", "do_handshake_on_connect": "", "is_ssl": "",
    "proxy_protocol": "", "proxy_allow_ips": "",
}

# gunicorn worker classes that run an ASGI app (uvicorn's, and uvicorn-worker's
# package): here the engine is that server, so they mean interface = "asgi"
ASGI_WORKERS = ("uvicorn.workers.UvicornWorker", "uvicorn.workers.UvicornH11Worker",
                "uvicorn_worker.UvicornWorker", "uvicorn_worker.UvicornH11Worker")


class Refused(ValueError):
    """A gunicorn setting we cannot honour (the message names it)."""


def translate(data: dict[str, Any], source: str, known: set[str]) -> tuple[dict, list[str]]:
    """data (one file's top-level names) with gunicorn's names made ours:
    (the settings to decode, warnings). Names in `known` (our keys and
    aliases) pass as they are. Raises Refused."""
    out: dict[str, Any] = {}
    warnings: list[str] = []
    for name, value in data.items():
        if name == "secure_scheme_headers" and isinstance(value, dict):
            # gunicorn's dict {"X-FORWARDED-PROTO": "https"}: our HEADER=VALUE list
            out[name] = [f"{k}={v}" for k, v in value.items()]
        elif name in TLS_NAMES and not value:
            continue                               # gunicorn's "off": None, ""
        elif name == "cert_reqs" and isinstance(value, int) and not isinstance(value, bool):
            if value not in CERT_REQS:
                raise Refused(f"{source}: cert_reqs = {value}: gunicorn's ssl.CERT_NONE (0), "
                              f"CERT_OPTIONAL (1) or CERT_REQUIRED (2)")
            out[name] = CERT_REQS[value]
        elif name == "worker_class" and value in ASGI_WORKERS:
            warnings.append(f"{source}: gunicorn's worker_class = {value!r}: served as "
                            f"interface = \"asgi\" (the engine is the ASGI server)")
            out.setdefault("interface", "asgi")
        elif name == "umask" and isinstance(value, int) and not isinstance(value, bool):
            out[name] = oct(value)                 # gunicorn's int (0o027): our octal text
        elif name in known:
            out[name] = value
        elif name == "accesslog":
            if value:                              # a path, or "-": stderr (as ours)
                out["access_logfile"] = value
                out["access_log"] = True
        elif name == "errorlog":
            if value:
                out["error_logfile"] = value
        elif name == "logconfig_json":
            if value and not isinstance(data.get("logconfig_dict"), dict):
                out["log_config"] = value          # a dictConfig JSON file: ours reads it
        elif name == "logconfig_dict":
            if value:                              # gunicorn's: it wins over logconfig_json
                out["log_config"] = value
                warnings += _gunicorn_loggers(value, source)
        elif name in HARMLESS:
            if value:
                shown = f"hook {name}()" if callable(value) else f"{name} = {value!r}"
                warnings.append(f"{source}: gunicorn's {shown} is ignored: {HARMLESS[name]}")
        elif name in UNSUPPORTED:
            if value:
                why = UNSUPPORTED[name]
                raise Refused(f"{source}: gunicorn's {name} is not supported by sockherd"
                              + (f": {why}" if why else ""))
        else:
            out[name] = value                      # unknown: the decoder names it
    return out, warnings


def _gunicorn_loggers(table: Any, source: str) -> list[str]:
    """A warning for each of gunicorn's own loggers the table configures:
    nothing logs to them here (our lines are sockherd.master's and
    sockherd.worker's, under the root logger; the access log is the
    access_logfile's)."""
    loggers = table.get("loggers") if isinstance(table, dict) else None
    if not isinstance(loggers, dict):
        return []
    return [f"{source}: logconfig_dict's logger {name!r} gets nothing here: sockherd logs "
            f"as 'sockherd.master' and 'sockherd.worker' (under the root logger), and "
            f"writes the access log itself (access_logfile)"
            for name in loggers if isinstance(name, str) and name.startswith("gunicorn")]


def is_gunicorn_name(name: str) -> bool:
    return name in HARMLESS or name in UNSUPPORTED or name in HOOKS \
        or name in ("accesslog", "errorlog", "logconfig_json", "logconfig_dict")
