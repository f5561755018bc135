"""A worker process from exec to READY, then its control channel.

1. PR_SET_PDEATHSIG, then a check that the parent is still the master that
   started us (it may have died before the prctl).
2. The Assignment from the master, with the listener fds: each is checked
   against its descriptor (ipc.listeners.adopt: all or nothing). With
   --user/--group, the switch (worker/identity.py: capabilities dropped,
   no_new_privs), then PR_SET_PDEATHSIG again and the parent check again.
3. The process title, the app import and its interface (worker/interface.py:
   logged), one fdcore Table of T threads in G groups, the listeners
   inserted once per group, the loop threads started. An ASGI app's
   lifespan startup (worker/lifespan.py) runs then, its listeners not polled
   until it completed: nothing is served before.
4. READY to the master, or FAILED_BEFORE_READY with the reason (a traceback
   for an app that does not import, the app's message for a failed
   startup) and exit status 1.
Then the main thread serves the channel (worker/channel_service.py): it
sends a heartbeat every heartbeat_interval (and echoes the master's
probes); Drain stops accepting and lets connections finish (Loop.drain),
and the worker exits once none remains or at the drain's deadline; Stop
ends the worker at once; EOF (the master is gone) and SIGTERM drain too,
within hard_stop_after. This module is the start and the exit around it.
"""
from __future__ import annotations

import logging
import os
import resource
import signal
import socket
import sys
from typing import TYPE_CHECKING

from sockherd.fdcore import Table
from sockherd.ipc.channel import Channel
from sockherd.ipc.errors import IPCError
from sockherd.ipc.listeners import adopt
from sockherd.ipc.messages import Assignment, FailedBeforeReady, Ready
from sockherd.master.tls import take_secrets
from sockherd.master.tls_binds import TLS_LISTENERS
from sockherd.worker import ENV_BOARD, ENV_FD, ENV_MASTER, ENV_NOFILE
from sockherd.worker import hooks as hooks_mod
from sockherd.worker.app import AppImportError, cause_traceback, import_app
from sockherd.worker import logfiles
from sockherd.worker.board import SLOTS, Board
from sockherd.worker.channel_service import retire_after, serve_channel
from sockherd.worker.embedded import status_app
from sockherd.worker.gate import STARTUP
from sockherd.worker.identity import IdentityError, resolve, switch
from sockherd.worker.interface import InterfaceError, choose
from sockherd.worker.loop import Loop
from sockherd.worker.proxy import DEFAULT_ALLOW, Policy
from sockherd.worker.stream_output import OUTPUT_LIMIT
from sockherd.worker.wsgi import make_handler

if TYPE_CHECKING:      # imported where used: asyncio's import is for ASGI workers only
    from sockherd.worker.lifespan import Lifespan

log = logging.getLogger("sockherd.worker")
ASSIGNMENT_TIMEOUT = 30.0


class BootstrapError(Exception):
    """Why this worker cannot become READY (sent to the master as is)."""


def _prepare(msg: Assignment, fds: list[int], master: int) -> tuple[Loop, Lifespan | None]:
    import prctl

    cfg = msg.config
    # the ticket secret and the key's bytes go to the engine alone: neither
    # the hooks nor the worker's lifelong config keeps them (master/tls.py)
    secrets = take_secrets(cfg)
    try:
        _logging(cfg)
    except BootstrapError:
        for fd in fds:                         # the listeners it came with
            os.close(fd)
        raise
    socks = adopt(msg.listeners, fds)          # closes every fd on a mismatch
    try:
        ident = resolve(cfg.get("user", ""), cfg.get("group", ""))
        if ident is not None:
            switch(ident)                      # before the app runs any code
            # a credential change clears the parent-death signal: set it
            # again, then make sure the master did not die in between
            prctl.set_pdeathsig(signal.SIGTERM)
            if master and os.getppid() != master:
                raise BootstrapError("the master exited while this worker switched user")
    except (IdentityError, BootstrapError) as exc:
        for s in socks:
            s.close()
        raise BootstrapError(str(exc)) from None
    # no app: the embedded status page, named as the master names it (cli.py)
    prctl.set_proctitle(f"sockherd: worker {msg.generation}.{msg.worker_index} "
                        f"[{cfg.get('proc_name') or msg.app or 'embedded'}]")
    lifespan = None
    # which listeners serve TLS (master/tls_binds.py): the master says per
    # listener; a config without the list (a worker started by hand) has
    # every one TLS when certfile is set, as before TLS per bind
    tls = cfg.get(TLS_LISTENERS) or [bool(cfg.get("certfile"))] * len(socks)
    if len(tls) != len(socks):
        for s in socks:
            s.close()
        raise BootstrapError(f"{len(socks)} listeners but {len(tls)} TLS flags")
    if not msg.app:
        handler = make_handler(status_app, dict(cfg, **secrets))     # the embedded default
    else:
        try:
            app = import_app(msg.app, chdir=cfg.get("chdir", ""),
                             pythonpath=cfg.get("pythonpath", []),
                             factory=bool(cfg.get("factory")))
            chosen = choose(app, cfg.get("interface", "auto"), f"app {msg.app!r}")
            hooks = _post_worker_init(msg, cfg, chosen.app, master)
        except (AppImportError, InterfaceError, hooks_mod.HooksError) as exc:
            for s in socks:
                s.close()
            cause = cause_traceback(exc.__cause__) if exc.__cause__ else ""
            raise BootstrapError(f"{cause}{exc}") from None
        log.info("interface: %s", chosen)
        if chosen.kind == "wsgi":
            # the app, served over HTTP/1.1 (wrapped only for pre/post_request hooks)
            handler = make_handler(hooks_mod.wrap_wsgi(chosen.app, hooks, WORKER[0]),
                                   dict(cfg, **secrets))
        elif chosen.kind == "asgi":
            state: dict = {}        # the lifespan's, copied into each request's scope
            handler = _asgi_handler(hooks_mod.wrap_asgi(chosen.app, hooks, WORKER[0]),
                                    dict(cfg, **secrets), state)
            if cfg.get("lifespan", "auto") != "off":
                from sockherd.worker.lifespan import Lifespan     # asyncio: ASGI workers only
                lifespan = Lifespan(chosen.app, cfg.get("lifespan", "auto"), state,
                                    threads=int(cfg.get("threads", 1)))
        else:
            if any(tls):
                # decided: TLS is the HTTP interfaces' (a stream handler
                # gets raw bytes; terminate TLS in front of it)
                for s in socks:
                    s.close()
                raise BootstrapError("certfile is set, but TLS is served for the HTTP "
                                     "interfaces (wsgi, asgi) only: a stream app gets its "
                                     "bytes as they come (terminate TLS in front of it)")
            handler = chosen.app                       # a stream handler class
    # one context more than the loop threads: the main thread's, to drain
    # at once even while every loop thread is inside a slow handler
    table = Table(int(cfg.get("threads", 1)) + 1, int(cfg.get("thread_groups", 1)))
    loop = Loop(table, handler, control=True,
                takeover_after=float(cfg.get("takeover_after", 0.5)),
                max_connections=int(cfg.get("max_connections", 0)),
                output_limit=int(cfg.get("stream_output_limit") or OUTPUT_LIMIT),
                proxy=Policy(cfg.get("proxy_protocol", "off"),
                             cfg.get("proxy_allow_from", DEFAULT_ALLOW)),
                header_timeout=float(cfg.get("header_timeout", 15.0)))
    loop.identity = (msg.generation, msg.worker_index)
    loop.config = cfg                   # the embedded page finds the control endpoint in it
    for s, on in zip(socks, tls):
        loop.add_listener(s, tls=on)
    if lifespan is not None:
        # nothing is served before startup completed: the listeners are in
        # the table but not polled (connections wait in the backlog, and in
        # a reload the serving generation takes them) until it did
        loop.gate.off(loop.control, STARTUP)
    loop.start()
    if lifespan is not None:
        _start_lifespan(loop, lifespan, cfg)
    return loop, lifespan


# this worker's hooks and the Worker view they are given (worker_exit needs both)
HOOKS: list[hooks_mod.Hooks] = [hooks_mod.Hooks()]
WORKER: list[hooks_mod.Worker | None] = [None]


def _post_worker_init(msg: Assignment, cfg: dict, app, master: int) -> hooks_mod.Hooks:
    """This worker's hooks loaded, and post_worker_init run: the app is
    imported, nothing is served yet. Its exception is this worker's failed
    start, with its traceback (HooksError: the cause chained)."""
    hooks = hooks_mod.load(str(cfg.get("hooks", "")), chdir=cfg.get("chdir", ""),
                           pythonpath=cfg.get("pythonpath", []))
    worker = hooks_mod.Worker(pid=os.getpid(), ppid=master or os.getppid(), cfg=cfg,
                              generation=msg.generation, index=msg.worker_index, wsgi=app)
    HOOKS[0], WORKER[0] = hooks, worker
    try:
        hooks.run("post_worker_init", worker)
    except Exception as exc:            # noqa: BLE001 - the operator's code
        raise hooks_mod.HooksError(f"hook post_worker_init ({hooks.source}) failed: "
                                   f"{exc!r}") from exc
    return hooks


def _asgi_handler(app, cfg: dict, state: dict):
    """The ASGI HTTP adapter's handler class (asyncio: ASGI workers only)."""
    from sockherd.worker import asgi
    return asgi.make_handler(app, cfg, state=state)


def _start_lifespan(loop: Loop, lifespan: Lifespan, cfg: dict) -> None:
    """Lifespan startup on loop thread 0's asyncio loop, then the listeners
    polled. A failure stops the loop (its listeners closed) and raises
    BootstrapError with the app's message: FAILED_BEFORE_READY."""
    from sockherd.worker.lifespan import LifespanFailed

    try:
        lifespan.start(loop.aio_loop(0), float(cfg.get("ready_timeout", 60.0)))
    except LifespanFailed as exc:
        lifespan.close()
        loop.stop()
        loop.table.close()
        raise BootstrapError(str(exc)) from None
    loop.gate.on(loop.control, STARTUP)


def _log_totals(loop: Loop) -> None:
    """One line with the loop threads' fdcore counters summed, as the worker
    exits: what an operator (and bench/) reads without a control channel."""
    total: dict[str, int] = {}
    for th in loop.loop_threads:
        for name, value in th.counters().items():
            total[name] = total.get(name, 0) + value
    keys = ("accepted", "accept_empty", "fd_takeover", "loops", "wake_nowork", "ctl_err")
    log.info("totals: %s", " ".join(f"{k}={total.get(k, 0)}" for k in keys))


def _soft_fd_limit(soft: str) -> None:
    """Our soft RLIMIT_NOFILE back to the one the master was started with
    (it raised its own to the hard limit; the fd table is sized from ours,
    and 2^20 slots would cost tens of MB). Set by ourselves, first thing:
    lowered from outside (prlimit), a process holding fds above the new
    limit may break (valgrind asserts)."""
    if not soft.isdigit():
        return
    now, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if int(soft) < now:
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(soft), hard))


def _logging(cfg: dict) -> None:
    """The settings' logging: fd 2 is the error log already (inherited from
    the master, master/logs.py): kept for USR1's reopen; the format and
    log_config as the master has them. A bad log_config (changed since the
    master read it, at a reload) fails the start like a bad app."""
    path = str(cfg.get("error_logfile", logfiles.STDERR))
    if path != logfiles.STDERR:
        logfiles.OPENED.append(logfiles.LogFile.adopt(path, "error_logfile", 2))
    try:
        logfiles.configure(f"worker {os.getpid()}", str(cfg.get("log_level", "info")),
                           str(cfg.get("log_format", "text")), cfg.get("log_config") or "")
    except logfiles.LogFileError as exc:
        raise BootstrapError(str(exc)) from None


def main() -> int:
    import prctl

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s [worker {os.getpid()}] %(levelname)s %(message)s")
    # USR1: the log files anew (worker/logfiles.py); blocked since the spawn
    # (master/spawn.py), so one sent before this line is delivered now
    signal.signal(signal.SIGUSR1, lambda *_: logfiles.reopen_all())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    fd = int(os.environ.pop(ENV_FD))
    master = int(os.environ.pop(ENV_MASTER, "0"))
    _soft_fd_limit(os.environ.pop(ENV_NOFILE, ""))
    # a terminal's Ctrl-C / Ctrl-\ reach the whole process group: the master
    # decides what a fast stop means (it kills us); TERM stays deadly (PDEATHSIG)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    prctl.set_pdeathsig(signal.SIGTERM)
    if master and os.getppid() != master:
        return 1                                   # the master died before the prctl
    ch = Channel.from_fd(fd)
    try:
        got = ch.recv(timeout=ASSIGNMENT_TIMEOUT)
        if not isinstance(got.msg, Assignment):
            got.close_fds()
            raise BootstrapError(f"expected an assignment first, got {type(got.msg).__name__}")
        loop, lifespan = _prepare(got.msg, got.fds, master)
    except (BootstrapError, IPCError, OSError) as exc:
        reason = str(exc) or type(exc).__name__
        log.error("failed before ready: %s", reason)
        try:
            ch.send(FailedBeforeReady(reason=reason), timeout=5)
        except IPCError:
            pass
        return 1
    # SIGTERM (a process-group TERM, or PDEATHSIG) drains; the handler only
    # wakes the main thread's select
    sig_r, sig_w = socket.socketpair()
    sig_r.setblocking(False)
    sig_w.setblocking(False)
    signal.set_wakeup_fd(sig_w.fileno(), warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, lambda *_: None)
    board_fd = int(os.environ.pop(ENV_BOARD, "-1"))
    if board_fd >= 0:
        # the balance between workers (worker/board.py, worker/gate.py)
        cfg = got.msg.config
        workers = int(cfg.get("workers") or os.cpu_count() or 1)
        gate = loop.gate
        gate.board = Board(board_fd)
        gate.index = got.msg.board_slot if got.msg.board_slot >= 0 else got.msg.worker_index
        # rows of every live worker: during a reload two generations serve
        gate.upto = min(SLOTS, max(2 * workers, gate.index + 1) + 8)
        gate.publish()
    retire = retire_after(loop, got.msg.config)
    ch.send(Ready(pid=os.getpid()))
    try:
        return serve_channel(ch, loop, got.msg.config, sig_r, retire, lifespan)
    finally:
        if lifespan is not None:
            lifespan.close()
        loop.stop()
        if WORKER[0] is not None:
            HOOKS[0].call("worker_exit", hooks_mod.Server(pid=WORKER[0].ppid, cfg=WORKER[0].cfg),
                          WORKER[0])
        _log_totals(loop)
        loop.table.close()
        ch.close()
