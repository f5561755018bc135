"""Each loop thread's asyncio event loop, on that thread's fdcore poller.

Facts that shaped it:

  - asyncio's SelectorEventLoop asks one thing of its selector per
    iteration (`_run_once`): select(timeout) -> the fds that are ready,
    then it runs what is due and what is ready. Everything else (the self-
    pipe of call_soon_threadsafe, sockets, add_reader) goes through the
    selector's register/modify/unregister.
  - A loop thread already has one poller (its fdcore context, one epoll)
    and one loop body (worker/loop.py: the engine's turn, the listeners,
    the mailbox, the timers, the drain step). A second epoll per thread
    would mean two waits, and a thread asleep in one while the other has
    work.

What this means here: the selector below IS the loop thread. Its
select(timeout) runs one iteration of the loop body (Loop._turner) with
that timeout folded in, and returns the app's own fds among the reports.
An fd the app registers (a socket of asyncpg, httpx, the loop's self-
pipe) is inserted into the same fdcore table, owned by this thread alone,
with a kind of its own (KIND_AIO), and DISOWNED: the table never closes
it (the app does, after unregistering it). Its reports come back from the
turn like a listener's, are left at once (the thread holds no running bit
on an app fd once select returns, so unregister's delete forgets the fd
at once and its number may be reused) and handed to asyncio. epoll is
level-triggered for such an fd (not FDC_EDGE), as asyncio expects.

An app may close its fd while it is still registered (a socket with a
pending loop.sock_recv(); asyncio itself tolerates it: epoll forgets a
closed fd). The kernel may then give that number to a new connection: the
engine forgets the stale entry it finds there (disowned: never closed by
the table) and takes the connection (worker/native/engine/engine_accept.c; before,
every connection given the number was closed unanswered). The app's key of
the old fd is still in this selector: every table verb of it goes through
engine.app_fd, which acts only while the number's owner is still that
registration's cookie, so a stale key never touches the connection (issue
35 point 3).

A request's task is created inside select() (the engine serves the
request in the turn): it is in the ready queue before `_run_once` counts
it, so a request whose app never waits completes in the same iteration
(Python 3.11 has no eager tasks; this gets the same latency).

A SystemExit or KeyboardInterrupt that an app task raises goes through
asyncio (Task.__step re-raises them after recording them on the task)
and out of run_forever: the task is done and its request answered by its
done callback (worker/native/app/asgi/asgi_app.c), so the loop runs again. Only
an error out of the turn itself (ours) ends the loop thread.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import math
import selectors
import time

from sockherd.worker._aio import (caller as _caller, future_maker as _future_maker,
                                  not_debugging as _not_debugging, runner as _runner,
                                  task_maker as _task_maker)

from sockherd.worker.loop_core import KIND_AIO    # the table's kind of an app fd

log = logging.getLogger("sockherd.worker")


# fdcore's report bits (fdcore/fd-t.h FDC_POLL_*)
_IN, _OUT, _ERR, _HUP, _RDHUP = 0x100, 0x400, 0x800, 0x1000, 0x2000
_READABLE = _IN | _ERR | _HUP | _RDHUP
_WRITABLE = _OUT | _ERR | _HUP

# engine.app_fd's verbs (worker/native/engine/engine_accept.c)
_DELETE, _WANT_RECV, _STOP_RECV, _WANT_SEND, _STOP_SEND = range(5)

_MAX_WAIT_MS = 3_600_000          # as worker/loop_core.py's: poll's timeout is 32-bit


class PollerSelector(selectors._BaseSelectorImpl):
    """A selector over loop thread `th`'s fdcore context: select() is one
    turn of the loop thread (turn(timeout_ms) -> the app fds' reports)."""

    def __init__(self, owner, th, me, turn):
        super().__init__()
        self._owner = owner
        self._th = th
        self._me = me
        self._app_fd = owner.engine.app_fd     # a table verb, checked by its cookie
        self._busy = owner.relief.busy         # the loop threads' busy stamps
        self._turn = turn
        self._stopping = owner._stop           # the Loop's stop: the asyncio loop's too
        self.loop = None                        # the asyncio loop this selector serves
        self._cookies: dict[int, int] = {}
        self.failed = False                 # the turn raised: ours, the thread ends

    def _want(self, fd: int, old: int, new: int) -> None:
        # each verb only while the number is still this registration's
        # (engine.app_fd checks its cookie): the app may have closed the fd
        # while registered, and the number be a connection's now
        cookie, app_fd, me = self._cookies[fd], self._app_fd, self._me
        if (new ^ old) & selectors.EVENT_READ:
            app_fd(me, fd, cookie, _WANT_RECV if new & selectors.EVENT_READ else _STOP_RECV)
        if (new ^ old) & selectors.EVENT_WRITE:
            app_fd(me, fd, cookie, _WANT_SEND if new & selectors.EVENT_WRITE else _STOP_SEND)

    def register(self, fileobj, events, data=None):
        key = super().register(fileobj, events, data)
        cookie = next(self._owner._cookies)
        try:
            # disown: the app closes its fd; the table only forgets it
            self._owner.table.insert(key.fd, cookie, tgid=self._th.tgid,
                                     thread_mask=self._th.bit, kind=KIND_AIO, disown=True)
        except BaseException:
            super().unregister(fileobj)
            raise
        self._cookies[key.fd] = cookie
        self._want(key.fd, 0, events)
        return key

    def unregister(self, fileobj):
        key = super().unregister(fileobj)
        cookie = self._cookies.pop(key.fd)
        if not self._app_fd(self._me, key.fd, cookie, _DELETE) and \
                self._owner.table.dump(key.fd).owner == cookie:
            # a running bit still held (never, see above): the number stays
            # the table's until released; say so rather than reuse it blind
            # (not ours any more: the app closed it while registered, and
            # the engine forgot the entry when the kernel reused the number)
            log.error("app fd %d: unregistered while held; its number may be reused early",
                      key.fd)
        return key

    def modify(self, fileobj, events, data=None):
        try:
            key = self._fd_to_key[self._fileobj_lookup(fileobj)]
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None
        if events & ~(selectors.EVENT_READ | selectors.EVENT_WRITE) or not events:
            raise ValueError(f"Invalid events: {events!r}")
        if events != key.events:
            self._want(key.fd, key.events, events)
        if events != key.events or data is not key.data:
            key = key._replace(events=events, data=data)
            self._fd_to_key[key.fd] = key
        return key

    def select(self, timeout=None):
        if timeout is None:
            ms = -1
        elif timeout <= 0:
            ms = 0
        else:
            ms = min(_MAX_WAIT_MS, math.ceil(timeout * 1000))
        # (ThreadEventLoop's C iteration does what follows without this
        # frame: worker/aio_native/handles.c runner_turn). Only asyncio's
        # own _run_once calls here (a debugging loop: _fast): it runs the
        # app's callbacks between this return and the next call, so the
        # thread is stamped busy across that, as the C runner stamps its
        # ready pass (the `timeout` watch, worker/stuck.py; issue 35 review
        # of point 7: in debug mode nothing stamped a blocked loop)
        busy, me = self._busy, self._me
        busy[me] = 0.0                          # the turn stamps what it runs itself
        try:
            reports = self._turn(ms)
        except BaseException:
            self.failed = True
            raise
        if self._stopping.is_set():
            self.loop.stop()                    # run_forever returns after this iteration
        else:
            busy[me] = time.monotonic()
        return self._app_ready(reports) if reports else []

    def _app_ready(self, reports) -> list:
        """The (key, events) asyncio wants of a turn's reports (the app's
        own fds, registered with this selector)."""
        ready = []
        keys, cookies = self._fd_to_key, self._cookies
        for ev in reports:
            key = keys.get(ev.fd)
            if key is None or cookies.get(ev.fd) != ev.owner:
                continue                    # unregistered since (an older incarnation's)
            mask = 0
            if ev.events & _READABLE:
                mask |= selectors.EVENT_READ
            if ev.events & _WRITABLE:
                mask |= selectors.EVENT_WRITE
            mask &= key.events
            if mask:
                ready.append((key, mask))
        return ready


# While callbacks are ready, an iteration polls (turns) only if this many
# iterations ran since the last turn, or this long: the loop's I/O (new
# requests, the app's sockets, the mailbox, stop) waits at most that, and
# a run of short callbacks (sleep(0), call_soon chains, queue hand-offs)
# does not pay a turn per iteration (measured: a turn costs about as much
# as the iteration it serves; asyncio and uvloop poll every iteration).
_TURN_EVERY = 16
_TURN_AFTER = 0.001                 # seconds


class ThreadEventLoop(asyncio.SelectorEventLoop):
    """The asyncio loop of one loop thread (PollerSelector's).

    Its iteration (_run_once) is asyncio's, in C, but for the turn (the
    select): while callbacks or due timers are ready it turns only
    every _TURN_EVERY iterations or _TURN_AFTER seconds (above). Its
    handles are C objects that behave as asyncio's, made by call_soon,
    call_at and call_later in C without the checks only a debugging loop
    needs (worker/aio_native/handles.c); its create_task, create_future
    and get_debug too (worker/aio_native/tasks.c). A loop in debug mode runs asyncio's
    own code throughout."""

    def __init__(self, selector: PollerSelector):
        self._poller = selector     # before asyncio's __init__: its set_debug calls _fast
        super().__init__(selector)

    def _fast(self) -> None:
        """Our C call_soon, call_at, call_later, _run_once, create_task,
        create_future and get_debug while the loop is open and not debugging (found where
        asyncio's C Task and Future and run_forever look: an instance
        attribute before the class's method), asyncio's own otherwise: they
        check what ours do not."""
        names = ("call_soon", "call_at", "call_later", "_run_once", "create_task",
                 "create_future", "get_debug")
        if self._debug or self._closed:
            for name in names:
                self.__dict__.pop(name, None)
            return
        base = asyncio.BaseEventLoop
        self.call_soon = _caller(self, 0, base.call_soon)
        self.call_at = _caller(self, 1, base.call_at)
        self.call_later = _caller(self, 2, base.call_later)
        # its turns call the selector's parts with no Python frame of ours
        # and stamps the thread busy while the app's callbacks run (the
        # `timeout` watch, worker/stuck.py: a loop blocked in the app)
        sel = self._poller
        self._run_once = _runner(self, sel, base._run_once, _TURN_EVERY, _TURN_AFTER,
                                 sel._owner.relief.busy, sel._me)
        # every request's task is made here (asgi_app.c); a task factory
        # set by the app is still honoured (it goes to asyncio's own)
        self.create_task = _task_maker(self, base.create_task)
        # every wait of asyncio.Queue, Event, Lock, gather makes one
        self.create_future = _future_maker(self, base.create_future)
        self.get_debug = _not_debugging         # asyncio's Future asks it per Future

    def set_debug(self, enabled: bool) -> None:
        super().set_debug(enabled)          # asyncio's __init__ calls it too
        self._fast()

    def close(self) -> None:
        super().close()
        self._fast()


def run(owner, th, me: int, turn, started) -> None:
    """Loop thread `me`'s body when its app is ASGI: its asyncio loop runs
    until the Loop stops, each iteration one turn of the loop thread.
    started() is called once the loop runs (Loop.aio_loop's promise)."""
    selector = PollerSelector(owner, th, me, turn)
    aio = selector.loop = ThreadEventLoop(selector)
    owner._aio[me] = aio
    owner.engine.set_aio(me, aio)
    asyncio.set_event_loop(aio)
    aio.call_soon(started)
    while not owner._stop.is_set():
        try:
            aio.run_forever()
        except (SystemExit, KeyboardInterrupt) as exc:
            if selector.failed:
                raise
            # an app task's: recorded on its task, answered by its done
            # callback; the loop thread serves on
            log.error("an app task raised %s: contained, loop thread %d serves on",
                      type(exc).__name__, me)


def close(aio) -> None:
    """Closes a stopped thread's loop (the Loop's stop(), every loop thread
    gone): its tasks that never ended are cancelled first, their
    connections closed already."""
    if aio is None or aio.is_closed():
        return
    try:
        for task in asyncio.all_tasks(aio):
            # never to run again (its thread is gone): no "destroyed but
            # pending" report for what a stop cut short by design, and a
            # request's task created in the last turn, never started, is
            # closed unstarted (no "never awaited" warning)
            task._log_destroy_pending = False
            coro = task.get_coro()
            if inspect.iscoroutine(coro) and \
                    inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                coro.close()
            task.cancel()
        aio.close()
    except Exception:  # noqa: BLE001 - at exit: logged, the rest still closes
        log.exception("closing a loop thread's asyncio loop")
