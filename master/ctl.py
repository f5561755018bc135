"""`sockherd ctl`: one command to a running master, its answer printed.

The command's words are matched against master/commands (longest name
first: `show proc`), its arguments parsed from its typed definition, the
request sent over ZeroMQ (REQ), the reply printed as the command's table or,
with --json (before or after the command's words), as the exact JSON
result. Exit 0 on success, 1 on an error reply (the reason on stderr), 2 on
a usage error, 3 when no master answered in time. `upgrade` waits for the new image's new generation; `watch`
prints the event stream until interrupted (or --count events).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import msgspec
import zmq

from sockherd.ipc import control as proto

EXIT_ERROR, EXIT_USAGE, EXIT_NO_ANSWER = 1, 2, 3


class CtlError(Exception):
    """An error reply (timeout False) or no answer in time (timeout True)."""

    def __init__(self, message: str, timeout: bool = False, usage: bool = False):
        super().__init__(message)
        self.timeout, self.usage = timeout, usage


def _socket(ctx: zmq.Context, kind: int, endpoint: str, server_key: str | None,
            client_cert: str | None) -> zmq.Socket:
    """A connected socket; CtlError (usage) for keys or an endpoint that
    cannot be used, never a traceback (review)."""
    sock = ctx.socket(kind)
    sock.linger = 0
    try:
        if endpoint.startswith("tcp://"):
            if not server_key or not client_cert:
                raise CtlError(f"{endpoint}: a tcp:// endpoint needs --curve-server-key and "
                               f"--curve-client-cert", usage=True)
            public, secret = _certificate(client_cert)
            server_public, _ = _certificate(server_key)
            if not secret:
                raise CtlError(f"{client_cert}: no secret key in it", usage=True)
            sock.curve_publickey, sock.curve_secretkey = public, secret
            sock.curve_serverkey = server_public
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            raise CtlError(f"endpoint {endpoint!r}: {exc}", usage=True) from None
    except BaseException:
        sock.close(0)
        raise
    return sock


def _certificate(path: str):
    import zmq.auth

    try:
        return zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise CtlError(f"certificate {path}: {exc}", usage=True) from None


def request(endpoint: str, command: str, args: dict | None = None, *, timeout: float = 5.0,
            server_key: str | None = None, client_cert: str | None = None):
    """The result of one command; CtlError on an error reply or no answer."""
    from sockherd.master.control import live_endpoint

    if not live_endpoint(endpoint, wait=timeout):
        # a socket file nobody listens on (or none): ZeroMQ would wait the
        # whole timeout for a master that is not there
        raise CtlError(f"no master running at {endpoint}", timeout=True)
    ctx = zmq.Context.instance()
    sock = _socket(ctx, zmq.REQ, endpoint, server_key, client_cert)
    try:
        sock.send(proto.encode(proto.Request(command=command, args=args or {})))
        if not sock.poll(int(timeout * 1000), zmq.POLLIN):
            raise CtlError(f"no answer from {endpoint} within {timeout:g}s", timeout=True)
        try:
            reply = proto.decode_reply(sock.recv())
        except proto.ProtocolError as exc:
            raise CtlError(str(exc)) from None
    finally:
        sock.close(0)
    if not reply.ok:
        raise CtlError(reply.error)
    return reply.result


def _endpoint(ns) -> str:
    """The endpoint to ask: --endpoint; else the settings' when they name
    one (--runtime-dir, -c FILE, the environment's runtime_dir or
    control); else the masters running on this host (each in its own
    directory of the default places, master/control.py masters()): with
    -b ADDR the one listening there, with --pid the one of that pid (or
    pidfile), else the only one. Several are
    listed (a usage error), never one picked silently; none is "no master
    running" at once."""
    from sockherd.master import settings as S
    from sockherd.master.control import default_runtime_dirs, elsewhere, endpoint_of, masters

    if ns.endpoint:
        return ns.endpoint
    flags = {"runtime_dir": ns.runtime_dir} if ns.runtime_dir else {}
    settings = S.resolve(flags, config=ns.config)
    found = endpoint_of(settings)
    if found is None:
        raise CtlError("the settings say control = off: no control endpoint")
    pid = getattr(ns, "pid", None)
    if (settings.runtime_dir or settings.control) and not ns.bind and not pid:
        return found
    dirs = default_runtime_dirs()
    live = masters(dirs)
    if ns.config and found in live and not ns.bind and not pid:
        return found                    # the one the config file describes
    if pid or ns.bind:
        # named: the default places' masters first, then those elsewhere
        # (an explicit --runtime-dir, control.elsewhere) if none matched
        pick = (lambda eps: _by_pid(eps, _pid_of(pid))) if pid else \
            (lambda eps: _by_bind(eps, ns.bind))
        try:
            return pick(live)
        except CtlError as exc:
            others = elsewhere(live)
            if not exc.timeout or not others:
                raise
            return pick(live + others)
    if len(live) == 1:
        return live[0]
    if not live:
        others = elsewhere(live)
        hint = ("; running with a --runtime-dir of their own: " + ", ".join(others)
                + " (say which with -b ADDRESS, --pid or --runtime-dir DIR)") if others else ""
        raise CtlError(f"no master running (none in {', '.join(dirs)}){hint}", timeout=True)
    raise CtlError("several masters run: " + "; ".join(
        f"{ep} ({', '.join(_listeners(ep)) or '?'})" for ep in live)
        + ": say which with -b ADDRESS (one it listens on), --endpoint ENDPOINT or "
        "--runtime-dir DIR", usage=True)


def _listeners(endpoint: str) -> list[str]:
    """What the master at endpoint listens on ([] if it does not answer)."""
    try:
        return list(request(endpoint, "status", timeout=2.0).get("listeners", []))
    except CtlError:
        return []


def _pid_of(given: str) -> int:
    """--pid: a number, or a pidfile's path (what `run -p` writes)."""
    if given.isdigit():
        return int(given)
    try:
        with open(given) as f:
            text = f.read(64).strip()
    except OSError as exc:
        raise CtlError(f"--pid {given}: cannot read it: {exc.strerror}", usage=True) from None
    if not text.isdigit():
        raise CtlError(f"--pid {given}: no pid in it ({text[:20]!r})", usage=True)
    return int(text)


def _by_pid(live: list[str], pid: int) -> str:
    """The one master of live whose pid is pid."""
    pids = {}
    for ep in live:
        try:
            pids[ep] = request(ep, "status", timeout=2.0).get("pid")
        except CtlError:
            pids[ep] = None
    hits = [ep for ep, p in pids.items() if p == pid]
    if hits:
        return hits[0]
    raise CtlError(f"no master running has pid {pid} (running: "
                   + ("; ".join(f"{ep} (pid {p})" for ep, p in pids.items()) or "none") + ")",
                   timeout=True)


def _by_bind(live: list[str], binds: list[str]) -> str:
    """The one master of live that listens on every address of binds."""
    def plain(address: str) -> str:       # as `status` lists listeners
        for prefix in ("tcp://", "tls://", "unix:"):
            address = address.removeprefix(prefix)
        return address

    want = {plain(b) for b in binds}
    listening = {ep: _listeners(ep) for ep in live}       # one status a master
    hits = [ep for ep in live if want <= {plain(x) for x in listening[ep]}]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise CtlError(f"no master running listens on {', '.join(sorted(want))} (running: "
                       + ("; ".join(f"{ep} ({', '.join(listening[ep])})" for ep in live)
                          or "none") + ")", timeout=True)
    raise CtlError(f"several masters listen on {', '.join(sorted(want))}: {', '.join(hits)}",
                   usage=True)


def list_masters() -> int:
    """`sockherd ctl list`: the masters running on this host, one a line."""
    from sockherd.master.control import default_runtime_dirs, elsewhere, masters

    live = masters(default_runtime_dirs())
    live += elsewhere(live)               # an explicit --runtime-dir's too
    for ep in live:
        try:
            st = request(ep, "status", timeout=2.0)
            print(f"pid {st['pid']}  generation {st['generation']}  "
                  f"{', '.join(st['listeners']) or 'nothing'}  {ep}")
        except CtlError as exc:
            print(f"?  {ep}: {exc}")
    if not live:
        print("no master running", file=sys.stderr)
    return 0 if live else EXIT_NO_ANSWER


def _arguments(cmd, words: list[str]) -> dict:
    """The command's arguments from the words after its name, by its Args
    fields: no default -> positional, bool -> --flag, other -> --name VALUE
    (or positional after the required ones)."""
    parser = argparse.ArgumentParser(prog=f"sockherd ctl {cmd.name}", description=cmd.help)
    info = msgspec.inspect.type_info(cmd.args)
    for f in info.fields:
        kind = f.type
        conv = int if isinstance(kind, msgspec.inspect.IntType) else str
        if isinstance(kind, msgspec.inspect.BoolType):
            parser.add_argument(f"--{f.name}", action="store_true")
        elif f.required:
            parser.add_argument(f.name, type=conv)
        else:
            parser.add_argument(f.name, type=conv, nargs="?", default=f.default)
    return vars(parser.parse_args(words))


def _print(cmd, result, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(cmd.render(result))


def _upgrade(endpoint: str, first: dict, timeout: float, keys: dict) -> dict:
    """After the old image's reply: the new one's generation, once it serves."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            st = request(endpoint, "status", timeout=2.0, **keys)
        except CtlError as exc:
            # no answer: the new image is not serving control yet; "ask
            # again": our status reached the old image just before its exec
            if not exc.timeout and str(exc) != proto.REEXECUTING:
                raise
            time.sleep(0.05)             # no socket yet: at once, not in the poll's time
            continue
        if st.get("upgrades_failed", 0) > first.get("upgrades_failed", 0):
            raise CtlError(f"upgrade failed: {st['last_upgrade_failure']}; this master "
                           f"carries on")
        if st["reloads_failed"] > first["reloads_failed"] and st["generation"] \
                == first["generation"]:
            raise CtlError(f"upgrade: the new image's reload failed: "
                           f"{st['last_reload_failure']}")
        if st["generation"] > first["generation"] and st["starting_generation"] is None:
            return {"pid": st["pid"], "generation": st["generation"],
                    "seconds": time.monotonic() - (deadline - timeout)}
        time.sleep(0.1)
    raise CtlError(f"upgrade: the new generation was not serving within {timeout:g}s",
                   timeout=True)


def _watch(endpoint: str, as_json: bool, count: int, keys: dict) -> int:
    ctx = zmq.Context.instance()
    sock = _socket(ctx, zmq.SUB, endpoint, keys.get("server_key"), keys.get("client_cert"))
    sock.setsockopt(zmq.SUBSCRIBE, proto.EVENT_TOPIC)
    print("watching", endpoint, file=sys.stderr, flush=True)
    seen = 0
    try:
        while not count or seen < count:
            frame = sock.recv()
            event = json.loads(frame[len(proto.EVENT_TOPIC):])
            if as_json:
                print(json.dumps(event, sort_keys=True), flush=True)
            else:
                stamp = time.strftime("%H:%M:%S", time.localtime(event.pop("time")))
                kind = event.pop("event")
                print(f"{stamp} {kind:<14} " + " ".join(f"{k}={v}" for k, v in event.items()),
                      flush=True)
            seen += 1
    except KeyboardInterrupt:
        pass
    finally:
        sock.close(0)
    return 0


def main(ns) -> int:
    from sockherd.master.commands import COMMANDS
    from sockherd.master.settings import SettingsError

    words = list(ns.words)
    if words == ["list"]:
        return list_masters()
    count = 0
    if words and words[0] == "watch" and "--count" in words:
        i = words.index("--count")
        try:
            count = int(words[i + 1])
        except (IndexError, ValueError):
            print("sockherd ctl watch: --count takes a number", file=sys.stderr)
            return EXIT_USAGE
        del words[i:i + 2]
    cmd = None
    for n in range(min(len(words), 2), 0, -1):
        cmd = COMMANDS.get(" ".join(words[:n]))
        if cmd is not None:
            rest = words[n:]
            break
    if cmd is None:
        print(f"sockherd ctl: unknown command {' '.join(words) or '(none)'!r}; the commands: "
              f"{', '.join(sorted(COMMANDS))}", file=sys.stderr)
        return EXIT_USAGE
    # ctl's own --json may come after the command's words too (`status --json`)
    as_json = ns.json or "--json" in rest
    rest = [w for w in rest if w != "--json"]
    try:
        args = _arguments(cmd, rest)
    except SystemExit as exc:
        return EXIT_USAGE if exc.code else 0
    keys = {"server_key": ns.curve_server_key, "client_cert": ns.curve_client_cert}
    timeout = ns.timeout if ns.timeout is not None else cmd.timeout
    try:
        endpoint = _endpoint(ns)
        result = request(endpoint, cmd.name, args, timeout=timeout, **keys)
        if cmd.name == "watch":
            from sockherd.master.control import events_endpoint
            return _watch(events_endpoint(endpoint), as_json, count, keys)
        if cmd.name == "upgrade" and result.get("upgrading"):
            result = _upgrade(endpoint, result, timeout, keys)
    except SettingsError as exc:
        print(f"sockherd ctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CtlError as exc:
        if as_json:
            print(json.dumps({"ok": False, "error": str(exc)}))
        print(f"sockherd ctl {cmd.name}: {exc}", file=sys.stderr)
        return EXIT_NO_ANSWER if exc.timeout else EXIT_USAGE if exc.usage else EXIT_ERROR
    _print(cmd, result, as_json)
    return 0
