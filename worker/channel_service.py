"""A worker's main thread after READY (worker/bootstrap.py got it there):
it serves the control channel to the master until the worker exits. One
select over the channel, the signal wake-up socket, the loop's drained and
failed eventfds and max_requests' eventfd: heartbeats out, the master's
probes echoed and its questions answered (worker/report.py), a Drain, the
master's death (EOF) or SIGTERM drain within hard_stop_after, a Stop ends
the worker at once, a loop thread that ended drains it to be replaced, and
the drain's deadline (the open WebSockets told 1001 first) ends it.

Apart from the start (bootstrap.py): what happens before READY fails the
start with a reason for the master; what happens here is a running
worker's. Imports nothing of bootstrap.py.
"""
from __future__ import annotations

import logging
import os
import random
import select
import signal
import socket
import time
from typing import TYPE_CHECKING

from sockherd.ipc.channel import Channel
from sockherd.ipc.errors import IPCError, PeerClosed
from sockherd.ipc.messages import (Drain, Error, Heartbeat, Retiring, Standby, StatsReply,
                                   StatsRequest, Stop)
from sockherd.worker import EXIT_DRAIN_DEADLINE, report
from sockherd.worker.stuck import StuckWatch, describe

if TYPE_CHECKING:      # asyncio's import is for ASGI workers only (lifespan); Loop: annotations
    from sockherd.worker.lifespan import Lifespan
    from sockherd.worker.loop import Loop

log = logging.getLogger("sockherd.worker")

# the worker's exit status after a loop thread ended (sysexits' EX_SOFTWARE):
# the master logs it and respawns the slot as it does a crash
EXIT_THREAD_ENDED = 70
# issue 23: at the drain's deadline the open WebSockets get close 1001 and
# this long for their close handshakes; below the master's second of
# slack before it kills a worker still draining (master/workers.py)
WS_CLOSE_GRACE = 0.5


def retire_after(loop: Loop, cfg: dict) -> tuple[int, int]:
    """max_requests (plus up to max_requests_jitter): the engine calls back
    on the request that reaches it; the callback only wakes the main thread
    (an eventfd), which owns the channel and tells the master. (fd, limit),
    or (-1, 0): off."""
    limit = int(cfg.get("max_requests") or 0)
    if not limit or loop.engine is None:
        return -1, 0
    limit += random.randint(0, int(cfg.get("max_requests_jitter") or 0))
    fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    loop.engine.retire_after(limit, lambda: os.eventfd_write(fd, 1))
    return fd, limit


def serve_channel(ch: Channel, loop: Loop, cfg: dict, sig_r: socket.socket,
                   retire: tuple[int, int] = (-1, 0), lifespan: Lifespan | None = None) -> int:
    """The main thread after READY: one select over the channel, the signal
    wake-up socket and the loop's drained eventfd; no timeout unless a drain
    has a deadline. SIGTERM drains (a TERM to the whole process group, as
    systemd's default KillMode and timeout(1) send, must not cut requests:
    the master drains us the same way), and so does the master's Drain or
    its death (EOF, or SIGTERM by PR_SET_PDEATHSIG). An ASGI app's lifespan
    shutdown runs once the drain has no connection left, before the loops
    stop, within the same deadline; the channel is served meanwhile (the
    heartbeats go on). A Stop ends the worker without it."""
    grace = float(cfg.get("idle_grace", 1.0))
    hard = float(cfg.get("hard_stop_after", 30.0))
    beat = float(cfg.get("heartbeat_interval", 5.0))
    retire_fd, retire_limit = retire       # max_requests (retire_after)
    deadline = None                    # monotonic time by which a drain must end
    status = 0                         # EXIT_THREAD_ENDED once a loop thread ended
    channel_open = True
    shutting_down = False              # drained: lifespan.shutdown sent, if any is due
    went_away = False                  # the WebSockets were told 1001 (issue 23)
    next_beat = time.monotonic() + beat
    beats = 0
    stuck = StuckWatch(loop, float(cfg.get("timeout") or 0.0))    # worker/stuck.py

    def drain(until: float, why: str) -> None:
        nonlocal deadline
        if deadline is None:
            log.info("draining (%s)", why)
            loop.drain(grace)
            deadline = until
        else:
            deadline = min(deadline, until)

    while True:
        timeout = None
        if deadline is not None:
            if loop.drained.is_set():
                if not shutting_down:
                    shutting_down = True
                    if lifespan is not None and lifespan.shutdown_due:
                        # said first: the app may answer before this thread logs
                        log.info("drained: no connection left; lifespan shutdown")
                        lifespan.begin_shutdown()
                    else:
                        log.info("drained: no connection left")
                if lifespan is None or not lifespan.shutdown_pending:
                    return status
            if not loop.threads_alive:
                # nobody left to serve or to drain: what they owned is closed
                log.error("no loop thread left: exiting")
                loop.refuse_posted()
                return status
            timeout = deadline - time.monotonic()
            if timeout <= 0 and not went_away and loop.websockets_open:
                # issue 23: open WebSockets were never cut before the
                # deadline; now each gets close 1001 from its loop thread,
                # and the close handshakes get WS_CLOSE_GRACE more
                went_away = True
                log.info("drain deadline: closing %d WebSocket(s) with 1001 (going away)",
                         loop.websockets_open)
                loop.going_away()
                deadline = time.monotonic() + WS_CLOSE_GRACE
                continue
            if timeout <= 0:
                if lifespan is not None and lifespan.shutdown_pending:
                    log.warning("drain deadline reached during the lifespan shutdown: "
                                "exiting without it")
                    return status or EXIT_DRAIN_DEADLINE
                cut = loop.open_connections
                log.warning("drain deadline reached with %d connection(s) still open: "
                            "exiting, they are cut", cut)
                loop.refuse_posted()
                return status or (EXIT_DRAIN_DEADLINE if cut else 0)
            # a connection queued at the drain's start that no loop thread
            # took within idle_grace (each is in a slow handler) is refused
            # now, never held up to the deadline (issue 18 §5: prompt)
            due = loop.posted_due(grace)
            if due is not None:
                if due <= time.monotonic():
                    loop.refuse_posted(waited=grace)
                    continue
                timeout = min(timeout, due - time.monotonic())
        if channel_open:
            # our heartbeat: the master only listens (one wake-up each side
            # per interval; its check timer fires only when one is late)
            now = time.monotonic()
            if now >= next_beat:
                beats += 1
                try:
                    ch.send(Heartbeat(seq=beats, sent_at=now), timeout=5)
                except IPCError:
                    pass                         # EOF is seen by the read below
                next_beat = now + beat
            timeout = next_beat - now if timeout is None else min(timeout, next_beat - now)
            due = stuck.due() if deadline is None else None
            if due is not None:
                timeout = min(timeout, max(0.0, due - now))
        # drained_fd stays readable once drained: not watched during the shutdown
        watch = [sig_r, loop.failed_fd] + ([loop.drained_fd] if not shutting_down else []) + \
            ([ch.fileno()] if channel_open else []) + ([retire_fd] if retire_fd >= 0 else []) + \
            ([lifespan.done_fd] if lifespan is not None and lifespan.shutdown_pending else [])
        if channel_open and ch.pending:
            # read with the Assignment (recv), not announced by the socket:
            # a Drain the came-back image of a failed upgrade sent a worker
            # still starting waited there for ever
            timeout = 0
        ready, _, _ = select.select(watch, [], [], timeout)
        if loop.failed_fd in ready:
            # a loop thread ended (logged with its traceback by that thread):
            # a worker short of a thread is replaced, never left half-serving
            os.eventfd_read(loop.failed_fd)
            status = EXIT_THREAD_ENDED
            why = "; ".join(f"{type(e).__name__}: {e}" for e in loop.errors) or "?"
            log.error("%d of %d loop threads ended (%s): draining, to be replaced",
                      len(loop.ended), len(loop.loop_threads), why)
            drain(time.monotonic() + hard, "a loop thread ended")
            continue
        if deadline is None and channel_open and (found := stuck.check(time.monotonic())):
            reason, text = describe(found, stuck.timeout)
            log.error("%s: asking to be replaced", text)
            try:
                ch.send(Retiring(requests=0, reason=reason[:4096]), timeout=5)
            except IPCError:
                pass
        if retire_fd in ready:
            os.eventfd_read(retire_fd)
            os.close(retire_fd)
            retire_fd = -1
            log.info("max_requests reached (%d): asking to be replaced", retire_limit)
            if channel_open:
                try:
                    ch.send(Retiring(requests=retire_limit), timeout=5)
                except IPCError:
                    pass
        if sig_r in ready:
            try:
                signums = sig_r.recv(64)
            except BlockingIOError:
                signums = b""
            if signal.SIGTERM in signums:
                drain(time.monotonic() + hard, "SIGTERM")
        if not channel_open or (ch.fileno() not in ready and not ch.pending):
            continue
        try:
            ch.read_available()
        except PeerClosed:
            channel_open = False
            log.warning("the master is gone: draining")
            drain(time.monotonic() + hard, "the master is gone")
            continue
        while (got := ch.next_message()) is not None:
            got.close_fds()
            msg = got.msg
            if isinstance(msg, Heartbeat):
                _reply(ch, msg)
            elif isinstance(msg, Stop):
                return status
            elif isinstance(msg, Drain):
                drain(msg.deadline, "the master asked")
            elif isinstance(msg, Standby):
                log.info("%s (the master asked)", "standing by: not accepting, kept-alive "
                         "clients let go" if msg.on else "accepting again")
                loop.standby(msg.on, grace)
            elif isinstance(msg, StatsRequest):
                _reply(ch, StatsReply(request_id=msg.request_id,
                                      stats=report.answer(loop, msg.what, msg.fd)))
            else:
                _reply(ch, Error(message=f"worker: {type(msg).__name__} is not handled"))


def _reply(ch: Channel, msg) -> None:
    """msg to the master, waiting 5 s at most for its socket to take it: a
    master that does not read meanwhile (stalled) gets it later (it stays
    queued: Channel.send), and this worker serves on. The send's timeout
    used to escape and end the worker (review of issue 19: a healthy worker
    crashed while the master sat in a blocking send to its stopped sibling).
    A master gone is seen by the next read."""
    try:
        ch.send(msg, timeout=5)
    except IPCError as exc:
        log.warning("a reply to the master is late (%s): sent when it reads again", exc)
