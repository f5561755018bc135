"""Every setting of sockherd, declared once: the table.

Each Setting names its key (TOML and attribute), its command-line flags, its type
with bounds, its default and its help. From that one table come (settings.py):
the argparse options (`add_arguments`), the `SOCKHERD_<KEY>` environment
variables, the TOML decoding, the final typed `Settings` struct and the docs
(`docs_markdown`, kept in docs/settings.md). msgspec does every type and bound check:
no hand-written ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

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
    # environment variables of the same meaning under another server's name
    # (gunicorn's and uvicorn's FORWARDED_ALLOW_IPS), read below ours
    foreign_envs: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def envs(self) -> tuple[str, ...]:
        """The environment variables read, the alias ones first (the
        setting's own name wins when both are set)."""
        return (self.foreign_envs + tuple(ENV_PREFIX + a.upper() for a in self.aliases)
                + (self.env,))

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
    Setting("app", ("app",), str, "",
            "the app, `module:callable`; `module:factory()` (or `--factory`): the callable "
            "called first, with the literal arguments given, and what it returns served; "
            "empty: the embedded status page",
            msgspec.Meta(pattern=r"^$|^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*(\(.*\))?$"),
            "MODULE:CALLABLE", section="app", positional=True, aliases=("wsgi_app",)),
    Setting("factory", ("--factory",), bool, False,
            "the app named is a factory: called with no arguments in each worker, what it "
            "returns is the app (uvicorn's --factory)", section="app"),
    Setting("hooks", ("--hooks",), str, "",
            "server hooks: a module (dotted name, imported after chdir and pythonpath) or a "
            "`.py` file whose functions named after the hooks are called (docs/settings.md, Hooks); "
            "a `-c FILE.py` that defines hook functions sets it to itself",
            metavar="MODULE|FILE.py", section="app"),
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
    Setting("raw_env", ("-e", "--env"), list[str], [],
            "`KEY=VALUE` put in the environment of the master and its workers before the app "
            "is imported (gunicorn's raw_env; repeatable), again at each reload",
            metavar="KEY=VALUE", section="app"),
    Setting("workers", ("-w", "--workers"), int, 0,
            "worker processes; 0: one per CPU (`WEB_CONCURRENCY`, as gunicorn reads it, "
            "changes this default)", msgspec.Meta(ge=0, le=1024), "N", section="workers"),
    # no short flag: gunicorn's -t is its --timeout (issue 36)
    Setting("threads", ("--threads",), int, 1,
            "threads per worker; more pay off only for apps that block (the GIL)",
            msgspec.Meta(ge=1, le=1024), "N", section="workers"),
    # accepted so that gunicorn configs run: both are what our threads do
    Setting("worker_class", ("-k", "--worker-class"), Literal["sync", "gthread"], "gthread",
            "gunicorn's worker class: `sync` and `gthread` are accepted and served by the "
            "threaded workers (`threads` says how many); any other class is refused",
            metavar="CLASS", section="workers"),
    Setting("thread_groups", ("--thread-groups",), int, 1,
            "thread groups per worker (at most 64 threads a group)",
            msgspec.Meta(ge=1, le=32), "G", section="workers"),
    Setting("bind", ("-b", "--bind"), list[str], ["127.0.0.1:8000"],
            "address to listen on: `host:port`, `[v6]:port`, `unix:/path`, `fd://N`, `systemd:NAME` (a socket-activated one; repeatable); `PORT` in the environment, as gunicorn reads it, makes the default `0.0.0.0:$PORT`. `tls://ADDRESS` serves TLS there (certfile's), and then the entries without it are plain (`tcp://ADDRESS`: plain, said explicitly)",
            msgspec.Meta(min_length=1), "ADDRESS", section="listeners"),
    Setting("backlog", ("--backlog",), int, 2048, "listen() backlog of each bound socket",
            msgspec.Meta(ge=1, le=65535), "N", section="listeners"),
    # issue 35, point 27: a peer gone without a FIN (host off, NAT entry dropped) is noticed
    Setting("tcp_keepalive", ("--tcp-keepalive",), int, 120,
            "TCP keep-alive on every TCP listener (bound, from systemd or from the previous "
            "master; accepted connections inherit it, unix sockets have none): a connection "
            "idle this many seconds is probed every max(1, this // 4) s, and closed after 4 "
            "unanswered probes, so a peer that vanished costs idle + 4 * interval "
            "(default 120 + 4 * 30 = 240 s; an idle kept-alive HTTP connection is closed by "
            "keepalive_timeout first, this bounds what has no timer: a WebSocket with "
            "ws_ping_interval 0, a streamed response waiting on the app); 0: off",
            msgspec.Meta(ge=0, le=32767), "S", section="listeners"),
    # 0666: whoever may reach a TCP port on loopback may connect (nginx as
    # www-data to a socket root bound: a 502 under 0660; gunicorn's is 0777
    # by its umask 0); 0660 with unix_owner keeps it to a group
    Setting("unix_mode", ("--unix-mode",), str, "0666",
            "file mode of bound unix sockets (octal); the default lets any local user "
            "connect, as to a port on 127.0.0.1: 0660 with unix_owner keeps it to a group",
            msgspec.Meta(pattern=r"^0?[0-7]{3}$"), "MODE", section="listeners"),
    Setting("unix_owner", ("--unix-owner",), str, "", "`user[:group]` owning bound unix sockets",
            metavar="USER[:GROUP]", section="listeners"),
    # HAProxy's PROXY protocol (worker/proxy.py, worker/native/conn/conn_proxy.c)
    Setting("proxy_protocol", ("--proxy-protocol",), Literal["off", "v1", "v2", "auto"], "off",
            "the PROXY protocol header a proxy in front sends ahead of each connection (HTTP "
            "and stream): `v1` (text), `v2` (binary, with TLVs), `auto` (either, told by its "
            "first byte); its source address becomes the client's (REMOTE_ADDR, the ASGI "
            "client, a stream's conn.peer). A peer in proxy_allow_from must send one (missing, "
            "malformed or slower than header_timeout: the connection closes, a log line); a "
            "header from any other peer is refused the same way", section="listeners"),
    Setting("proxy_allow_from", ("--proxy-allow-from",), list[str],
            ["127.0.0.0/8", "::1", "unix"],
            "the peers that send PROXY protocol headers: addresses or CIDRs, `unix` "
            "(unix-socket peers), `*` (all; repeatable, or comma-separated); the default: a "
            "proxy on the same host", metavar="CIDR", section="listeners"),
    # TLS in the engine (worker/native/conn/conn_tls.c); gunicorn's names for the first five
    Setting("certfile", ("--certfile",), str, "",
            "TLS: the server's certificate (PEM, the chain after it); set, every `bind` "
            "serves HTTPS, or only the ones marked `tls://` if any `bind` is marked (WSGI, "
            "ASGI, WebSocket; a stream app is refused). Read again by "
            "each reload: a missing or mismatched file refuses it (and the first start, exit 2)",
            metavar="FILE", section="tls"),
    Setting("keyfile", ("--keyfile",), str, "",
            "TLS: the certificate's private key (PEM); empty: in certfile", metavar="FILE",
            section="tls"),
    Setting("keyfile_password", ("--keyfile-password",), str, "",
            "TLS: the password of an encrypted keyfile (visible in `ps`: prefer "
            "keyfile_password_file or the environment)", metavar="PASSWORD", section="tls"),
    Setting("keyfile_password_file", ("--keyfile-password-file",), str, "",
            "TLS: a file whose first line is the keyfile's password", metavar="FILE",
            section="tls"),
    Setting("ca_certs", ("--ca-certs",), str, "",
            "TLS: the CAs (PEM) client certificates are verified against", metavar="FILE",
            section="tls"),
    Setting("cert_reqs", ("--cert-reqs",), Literal["none", "optional", "required"], "none",
            "TLS client certificates: `none` (not asked for), `optional` (asked for, verified "
            "if sent), `required` (a client without a valid one fails its handshake); their "
            "subject and issuer reach the app as SSL_CLIENT_S_DN, SSL_CLIENT_I_DN, "
            "SSL_CLIENT_VERIFY (WSGI) and the ASGI `tls` extension", section="tls"),
    Setting("ciphers", ("--ciphers",), str, "",
            "TLS 1.2 cipher list (OpenSSL's syntax); empty: OpenSSL's default (TLS 1.3's "
            "suites are always OpenSSL's)", metavar="LIST", section="tls"),
    Setting("ssl_min_version", ("--ssl-min-version",), Literal["TLSv1.2", "TLSv1.3"], "TLSv1.2",
            "TLS: the oldest protocol version a client may use", section="tls"),
    Setting("ssl_ticket_key_rotation", ("--ssl-ticket-key-rotation",), int, 3600,
            "TLS: seconds between session-ticket key rotations; a ticket is accepted for "
            "one to two rotations (the current key and the previous one), and a key "
            "rotated out is forgotten by every process (docs/guide.md, TLS)",
            msgspec.Meta(ge=5, le=7 * 86400), "SECONDS", section="tls"),
    Setting("user", ("--user",), str, "", "user the workers run as (the master keeps its own)",
            metavar="USER", section="workers"),
    Setting("group", ("--group",), str, "", "group the workers run as", metavar="GROUP",
            section="workers"),
    # gunicorn's umask (an int in its config, `-m 0o027` or octal digits on its command line)
    Setting("umask", ("-m", "--umask"), str, "",
            "the file mode mask of the master and its workers (octal: 022, 0o027), set at the "
            "start: the files the app writes; unix sockets take unix_mode whatever it is; "
            "empty: the one the master was started with (gunicorn's umask)",
            msgspec.Meta(pattern=r"^((0o|0)?[0-7]{1,4})?$"), "MASK", section="workers"),
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
            "after a reload's new generation is READY, the old one stands by this long "
            "(not accepting: only the new code answers; its kept-alive clients let go) and "
            "drains only then; a new worker that crashes meanwhile rolls the reload back (the "
            "old generation accepts again at once, the reload fails with why); `ctl reload "
            "--probation` answers when it is over; 0: the old generation drains at once; "
            "with --reload its default is 0", _seconds(0, 3600), "S",
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
    # gunicorn's timeout, for what it is meant to catch: a request that never
    # ends (a hung call, an endless loop). Our heartbeats come from the
    # worker's main thread, which never waits on requests: without this,
    # nothing notices a loop thread stuck in the app (worker/stuck.py)
    Setting("timeout", ("-t", "--timeout"), float, 0.0,
            "a request in the app longer than this gets its worker replaced (a new one READY "
            "first; the stuck one stops accepting, finishes the rest, and is killed at "
            "hard_stop_after), logged with the request and the stuck thread's stack "
            "(gunicorn's timeout; its default is 30, ours off); 0: never",
            _seconds(0, 86400), "S", section="supervision"),
    Setting("hard_stop_after", ("--hard-stop-after", "--graceful-timeout"), float, 30.0,
            "a draining worker still busy after this long is killed (gunicorn's "
            "graceful_timeout)", _seconds(0, 86400), "S",
            section="supervision", aliases=("graceful_timeout",)),
    Setting("pidfile", ("-p", "--pid"), str, "",
            "a file the master writes its pid to at start (removed at exit); empty: none",
            metavar="FILE", section="supervision"),
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
    # toward one of them (worker/native/parse/httpparse.h)
    Setting("limit_request_line", ("--limit-request-line",), int, 4094,
            "longest request line, CRLF excluded, empty lines before it included (longer: 414); "
            "0 (gunicorn's unlimited): the most we take, 1 MiB",
            msgspec.Meta(ge=0, le=1 << 20), "BYTES", section="http"),
    Setting("limit_request_field_size", ("--limit-request-field-size",
                                         "--limit-request-header-bytes"), int, 8190,
            "longest header or trailer field line, its CRLF included, as gunicorn counts (longer: 431); "
            "limit_request_header_bytes is its former name; 0 (gunicorn's unlimited): the most "
            "we take, 1 MiB",
            msgspec.Meta(ge=0, le=1 << 20), "BYTES", section="http",
            aliases=("limit_request_header_bytes",)),
    Setting("limit_request_fields", ("--limit-request-fields",), int, 100,
            "most header and trailer fields in a request (more: 431); 0 (gunicorn's "
            "unlimited): the most we take, 32768",
            msgspec.Meta(ge=0, le=32768), "N", section="http"),
    Setting("limit_request_body", ("--limit-request-body",), int, 0,
            "largest request body, chunk extensions and size padding included; "
            "0: no limit (larger: 413)",
            msgspec.Meta(ge=0), "BYTES", section="http"),
    Setting("body_timeout", ("--body-timeout",), float, 30.0,
            "a request body must arrive within this long (a second more per 64 KiB "
            "received): one read in the loop (body_buffer) is then refused 408, a WSGI app "
            "reading a streamed one gets an error, an ASGI one `http.disconnect` (and the "
            "client a 408, or the close once its response started); a response its client "
            "takes nothing of for this long is cut (the connection closes)",
            _seconds(0.1, 3600), "S", section="http"),
    # issue 23: uvicorn's --ws-max-size and its default
    Setting("ws_max_size", ("--ws-max-size",), int, 16 << 20,
            "ASGI WebSockets: the largest message (its fragments together) a client may "
            "send; a larger one closes the WebSocket with 1009; 0: no limit (not with "
            "ws_per_message_deflate: a compressed message would inflate without one)",
            msgspec.Meta(ge=0), "BYTES", section="http"),
    # issue 23: RFC 7692, off by default (uvicorn's is on): it costs zlib's state per connection (~80 KiB with context
    # takeover) and lets a small message inflate to ws_max_size
    Setting("ws_per_message_deflate", ("--ws-per-message-deflate",), bool, False,
            "ASGI WebSockets: negotiate permessage-deflate (RFC 7692) when a client offers "
            "it: messages compressed both ways, at the cost of zlib's state per connection; "
            "a message inflated past ws_max_size closes with 1009",
            section="http"),
    # issue 35, point 27: uvicorn's --ws-ping-interval / --ws-ping-timeout and their defaults
    Setting("ws_ping_interval", ("--ws-ping-interval",), float, 20.0,
            "ASGI WebSockets: one that heard nothing from its client for this long is sent a "
            "ping (any input, a pong or a message, counts and starts the interval again); "
            "0: never pinged",
            _seconds(0, 86400), "S", section="http"),
    Setting("ws_ping_timeout", ("--ws-ping-timeout",), float, 20.0,
            "ASGI WebSockets: if nothing comes this long after a ping, the client is presumed "
            "gone: close 1011 \"keepalive ping timeout\" without waiting for its answer, the "
            "app gets websocket.disconnect 1011; 0: never timed out (pings still sent, which "
            "keeps proxies and NATs from cutting an idle connection)",
            _seconds(0, 86400), "S", section="http"),
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
    Setting("keepalive_timeout", ("--keepalive-timeout", "--keep-alive"), float, 75.0,
            "an idle kept-alive connection is closed after this long (longer than the idle "
            "pools of common load balancers, as nginx; gunicorn's keepalive); 0: never",
            _seconds(0, 86400), "S", section="http", aliases=("keepalive",)),
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
    # behind a proxy (issue 24 §1; worker/forwarded.py, worker/native/conn/forwarded.h):
    # gunicorn's and uvicorn's names, defaults and list spelling
    Setting("forwarded_allow_ips", ("--forwarded-allow-ips",), list[str], ["127.0.0.1", "::1"],
            "peers trusted to say who the client is (X-Forwarded-For, Forwarded) and its "
            "scheme: addresses, CIDR networks, `*` (every peer), `unix` (unix-socket peers); "
            "comma-separated or repeated; empty: none (no header is looked at)",
            metavar="ADDRESSES", section="proxy", foreign_envs=("FORWARDED_ALLOW_IPS",)),
    Setting("secure_scheme_headers", ("--secure-scheme-headers",), list[str],
            ["X-Forwarded-Protocol=ssl", "X-Forwarded-Proto=https", "X-Forwarded-Ssl=on"],
            "`HEADER=VALUE` pairs: from a trusted peer, HEADER equal to VALUE means https, "
            "another value http (gunicorn's default); empty: none",
            metavar="HEADER=VALUE", section="proxy"),
    Setting("forwarder_headers", ("--forwarder-headers",), list[str], [],
            "which of `X-Forwarded-Host` (and Forwarded's host=), `X-Forwarded-Port`, "
            "`X-Forwarded-Prefix` a trusted peer may set (HTTP_HOST and SERVER_NAME, "
            "SERVER_PORT, SCRIPT_NAME / root_path); empty: none",
            metavar="HEADERS", section="proxy"),
    Setting("server_header", ("--server-header",), str, "",
            "the Server header of responses; empty: none", metavar="TEXT", section="http"),
    Setting("access_log", ("--access-log",), bool, False,
            "log one line per HTTP request to access_logfile (stderr if it is not set)",
            section="logging"),
    Setting("access_log_format", ("--access-log-format",), str,
            '%(h)s - - %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s" %(L)s',
            "access log line, gunicorn's atoms and meanings: h l u t r m U q H s B b f a T M D "
            "L p, {header}i, {header}o, {key}e (docs/guide.md, Logs)",
            metavar="FORMAT", section="logging"),
    # gunicorn's names (--access-logfile, --error-logfile) and meanings, but
    # `-` is stderr for both
    Setting("access_logfile", ("--access-logfile",), str, "",
            "where access lines go: a file (appended to; reopened on USR1) or `-` for stderr; "
            "setting it turns access_log on", metavar="PATH", section="logging"),
    Setting("error_logfile", ("--error-logfile",), str, "-",
            "where the master's and the workers' log lines (and their stderr) go: a file "
            "(appended to; reopened on USR1) or `-` for stderr", metavar="PATH",
            section="logging"),
    Setting("log_format", ("--log-format",), Literal["text", "json"], "text",
            "`json`: one JSON object per line in both logs, with stable keys (docs/guide.md, Logs)",
            section="logging"),
    Setting("log_config", ("--log-config",), str | dict[str, Any], "",
            "a logging.config.dictConfig file (`.toml`, else JSON), or in a settings file the "
            "dictConfig table itself (gunicorn's `logconfig_dict`), applied after the "
            "defaults, in the master and every worker", metavar="FILE", section="logging"),
    Setting("runtime_dir", ("--runtime-dir",), str, "",
            "where the control sockets live (created 0700); empty: a directory of this "
            "master's own, named after proc_name (else its bind addresses), in "
            "$XDG_RUNTIME_DIR/sockherd, else /run/sockherd as root, else a per-user directory "
            "under the temp dir: masters of other apps on the host never clash, and "
            "`sockherd ctl` finds each (`ctl list`)",
            metavar="DIR", section="control"),
    Setting("proc_name", ("-n", "--name"), str, "",
            "this master's name (gunicorn's proc_name): in its process titles and its workers' "
            "(`sockherd: master [NAME]`; empty: the app's), and the name of its control "
            "directory (runtime_dir)", msgspec.Meta(max_length=64), "NAME", section="control"),
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
            "least severe level logged (to error_logfile)", section="logging", aliases=("loglevel",)),
    # issue 24 §5: uvicorn's development names and meanings (master/devreload.py)
    Setting("reload", ("--reload",), bool, False,
            "development: reload (as HUP does) when a watched file changes: the project (the "
            "working directory, or reload_dirs), the app's package, pythonpath and "
            "reload_extra_files; a change that "
            "breaks the import is a refused reload, the last good code serving on; Ctrl-C "
            "drains in-flight requests for up to 5 s (again: at once). Needs `watchfiles` "
            "(`pip install 'sockherd[reload]'`)", section="development"),
    Setting("reload_dirs", ("--reload-dir",), list[str], [],
            "directories --reload watches instead of the working directory (uvicorn's "
            "--reload-dir; repeatable); the app's package and pythonpath are watched anyway",
            metavar="DIR", section="development"),
    Setting("reload_extra_files", ("--reload-extra-files",), list[str], [],
            "more files or directories watched with --reload (repeatable)", metavar="PATH",
            section="development"),
    Setting("reload_include", ("--reload-include",), list[str], ["*.py"],
            "file name patterns (glob) whose change reloads (repeatable; a file named in "
            "reload_extra_files always does)", metavar="GLOB", section="development"),
    Setting("reload_exclude", ("--reload-exclude",), list[str], [".*", "*~", "__pycache__"],
            "file or directory name patterns (glob) never watched (repeatable; watchfiles' "
            "own defaults, .git, editors' swap files and the like, always apply)",
            metavar="GLOB", section="development"),
)

BY_KEY = {s.key: s for s in SETTINGS}
ALIASES = {a: s.key for s in SETTINGS for a in s.aliases}
