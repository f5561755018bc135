"""The ASGI lifespan protocol (lifespan spec 2.0) for one worker.

One task per worker calls the app once with the lifespan scope and lives as
long as the worker serves: `lifespan.startup` goes in first, and the worker
is READY (and its listeners polled) only once the app answered
`lifespan.startup.complete`; `lifespan.shutdown` goes in when the worker's
drain has no connection left, and the worker exits once the app answered
(or at the drain's deadline). The scope's `state` dict is the one the HTTP
adapter copies into each request's scope (make_handler's `state`).

The `lifespan` setting, with uvicorn's names:

- off: the app never sees the lifespan scope.
- on: startup must complete. An app that sends `lifespan.startup.failed`,
  raises, or returns before completing it fails the worker before READY,
  with the app's message (bootstrap sends it to the master: a first start
  exits non-zero, a reload is refused).
- auto (the default): as on, except for an app that does not take part: one
  that raises or returns before it ever awaited `receive()` (the common
  `assert scope["type"] == "http"`). That is logged at info and the worker
  serves without lifespan. Unlike uvicorn's auto, an app that did receive
  `lifespan.startup` and then raised is a failed startup, not an app without
  lifespan support: it has startup code, and that code failed.

Where the task runs: on loop thread 0's asyncio loop (`Loop.aio_loop(0)`),
so that what startup creates (a connection pool, a
client) lives on a loop that serves requests. With more than one loop
thread (--threads N > 1) that is not enough: requests run on N loops, and what
startup made is bound to loop 0's (an asyncio.Lock shared by 8 requests:
3 RuntimeErrors, 4 hangs, 1 success; issue 35 point 10). Decided: an app
that takes part in lifespan (it asks receive() for lifespan.startup) is
refused there, before its startup code runs, and the worker fails before
READY with a message that says what to do (--threads 1, or lifespan off). One
lifespan per loop would run startup N times and still share what startup
puts in globals or app.state (the last one's, used from every loop); a
lifespan state safe across loops cannot be made of the app's objects. An
app that does not take part (auto) and `lifespan off` serve at any -t. The main thread only waits on
thread-safe futures. No timeout of its own: startup is bounded by the
master's ready_timeout (the worker is not READY before it ends; bootstrap
also gives up at that time), shutdown by the drain's deadline.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading

log = logging.getLogger("sockherd.worker")

SCOPE_ASGI = {"version": "3.0", "spec_version": "2.0"}


class LifespanFailed(Exception):
    """The app's startup failed; the message says how, in the app's words."""


class Lifespan:
    """The lifespan task of one worker: start() before READY, then
    begin_shutdown() once drained. `state` is shared with the HTTP adapter."""

    def __init__(self, app, mode: str, state: dict, threads: int = 1):
        assert mode in ("auto", "on")            # off: no Lifespan at all
        self.app = app
        self.mode = mode
        self.state = state
        self.threads = threads          # loop threads: > 1 refuses a taking part app
        self.supported = False          # startup completed: shutdown will be sent
        self.phase = "startup"          # -> serving -> shutdown -> done, or failed
        self.done_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)  # shutdown over
        self._fd_lock = threading.Lock()
        self._aio: asyncio.AbstractEventLoop | None = None
        self._task: concurrent.futures.Future | None = None     # _main, seen from here
        self._atask: asyncio.Task | None = None                 # ... and on its loop
        self._queue: asyncio.Queue | None = None
        self._shutdown_sent = False
        self._asked = 0                 # receive() calls: 0 = the app never took part
        self._started: concurrent.futures.Future = concurrent.futures.Future()
        self._stopped: concurrent.futures.Future = concurrent.futures.Future()

    # ---- the main thread's side ------------------------------------------------------
    def start(self, aio: asyncio.AbstractEventLoop, timeout: float) -> None:
        """Runs startup on `aio` (a serving loop thread's) and returns once
        it completed, or the app does not take part (auto). Raises
        LifespanFailed."""
        self._aio = aio
        self._task = asyncio.run_coroutine_threadsafe(self._main(), aio)
        try:
            self._started.result(timeout)
        except concurrent.futures.TimeoutError:
            self._cancel()
            raise LifespanFailed(f"lifespan startup did not complete within {timeout:g}s "
                                 f"(ready_timeout)") from None

    @property
    def shutdown_due(self) -> bool:
        """Startup completed and the app's task still runs: shutdown is sent."""
        return self.supported and self.phase == "serving"

    def begin_shutdown(self) -> bool:
        """Sends lifespan.shutdown; done_fd is readable once the app
        answered or ended. False: nothing to wait for (no lifespan)."""
        if not self.shutdown_due:
            return False
        self.phase = "shutdown"
        self._shutdown_sent = True
        self._stopped.add_done_callback(self._wake)
        self._aio.call_soon_threadsafe(self._queue.put_nowait, {"type": "lifespan.shutdown"})
        return True

    @property
    def shutdown_pending(self) -> bool:
        """lifespan.shutdown sent, the app not done with it yet."""
        return self._shutdown_sent and not self._stopped.done()

    def _cancel(self, wait: float = 0.5) -> None:
        """Cancels the app's task if it still runs, and gives its
        cancellation (the app's finally blocks) `wait` seconds on its loop."""
        if self._task is None or self._task.done() or self._aio.is_closed():
            return
        self._aio.call_soon_threadsafe(self._task_cancel)
        try:
            self._task.exception(wait)
        except (concurrent.futures.CancelledError, concurrent.futures.TimeoutError):
            pass

    def _task_cancel(self) -> None:
        if self._atask is not None:
            self._atask.cancel()

    def _wake(self, _) -> None:
        """The main thread's select(): the shutdown is over. Under the lock
        close() takes: a task that ends late must not write to the number
        after close() freed it (it may be another file's by then)."""
        with self._fd_lock:
            if self.done_fd >= 0:
                os.eventfd_write(self.done_fd, 1)

    def close(self) -> None:
        """Before the loops stop: a task still running (a shutdown past its
        deadline, a Stop) is cancelled. Idempotent."""
        self._cancel()
        with self._fd_lock:
            if self.done_fd >= 0:
                os.close(self.done_fd)
                self.done_fd = -1

    # ---- the task, on the asyncio loop -----------------------------------------------
    async def _main(self) -> None:
        self._atask = asyncio.current_task()
        self._queue = asyncio.Queue()
        self._queue.put_nowait({"type": "lifespan.startup"})
        scope = {"type": "lifespan", "asgi": dict(SCOPE_ASGI), "state": self.state}
        try:
            await self.app(scope, self._receive, self._send)
        except asyncio.CancelledError:
            self._ended(None, cancelled=True)
            raise
        except BaseException as exc:    # the app's code: anything, SystemExit included
            self._ended(exc)
        else:
            self._ended(None)

    async def _receive(self) -> dict:
        self._asked += 1
        if self._asked == 1 and self.threads > 1:
            self._refuse_threads()
        return await self._queue.get()

    def _refuse_threads(self) -> None:
        """The app takes part in lifespan (its first receive()) and the
        worker has several loop threads: refused before its startup code
        runs (module docstring, issue 35 point 10). Raised in the app too:
        its receive() never gives it lifespan.startup."""
        why = (f"lifespan startup refused: the app takes part in lifespan, and with "
               f"--threads {self.threads} its requests run on {self.threads} asyncio loops while "
               f"what its startup makes (a pool, a client, an asyncio.Lock) would be bound "
               f"to one loop (RuntimeError or a hang on the others); run --threads 1 (more "
               f"workers, -w, for more), or --lifespan off if its startup makes nothing "
               f"bound to a loop")
        self.phase = "failed"
        log.error("%s", why)
        self._started.set_exception(LifespanFailed(why))
        raise RuntimeError(why)

    async def _send(self, message: dict) -> None:
        kind = message.get("type") if isinstance(message, dict) else None
        if self.phase == "startup" and kind == "lifespan.startup.complete":
            self.phase = "serving"
            self.supported = True
            log.info("lifespan: startup complete")
            self._started.set_result(None)
        elif self.phase == "startup" and kind == "lifespan.startup.failed":
            self.phase = "failed"
            why = message.get("message", "") or "(no message)"
            log.error("lifespan: the app's startup failed: %s", why)
            self._started.set_exception(LifespanFailed(f"lifespan startup failed: {why}"))
        elif self.phase == "shutdown" and kind == "lifespan.shutdown.complete":
            self.phase = "done"
            log.info("lifespan: shutdown complete")
            self._stopped.set_result(None)
        elif self.phase == "shutdown" and kind == "lifespan.shutdown.failed":
            self.phase = "done"
            log.error("lifespan: the app's shutdown failed: %s",
                      message.get("message", "") or "(no message)")
            self._stopped.set_result(None)
        else:
            # the spec: a message the server does not expect raises in the app
            raise RuntimeError(f"unexpected ASGI message {message!r} in lifespan "
                               f"{self.phase} (lifespan spec 2.0)")

    def _ended(self, exc: BaseException | None, cancelled: bool = False) -> None:
        """The app returned or raised (exc) from the lifespan scope."""
        phase, self.phase = self.phase, "done"
        if phase == "startup":
            if not self._asked and self.mode == "auto" and not cancelled:
                how = f"raised {type(exc).__name__}: {exc}" if exc else "returned"
                log.info("lifespan: not supported by the app (it %s before asking for "
                         "lifespan.startup): serving without it", how)
                self._started.set_result(None)
                return
            if exc is not None:
                log.error("lifespan: the app raised during startup", exc_info=exc)
                why = f"the app raised {type(exc).__name__}: {exc}"
            elif cancelled:
                why = "its task was cancelled"
            else:
                why = "the app returned without lifespan.startup.complete"
            self._started.set_exception(LifespanFailed(f"lifespan startup failed: {why}"))
            return
        if exc is not None and phase != "failed":
            log.error("lifespan: the app raised during %s", phase, exc_info=exc)
        elif phase == "serving" and not cancelled:
            log.warning("lifespan: the app returned from the lifespan scope while serving: "
                        "no shutdown will be sent")
        elif phase == "shutdown" and not cancelled:
            log.warning("lifespan: the app returned without lifespan.shutdown.complete")
        if not self._stopped.done():
            self._stopped.set_result(None)
