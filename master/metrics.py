"""--metrics HOST:PORT: Prometheus metrics and the live status page.

One HTTP listener in the master, served from a thread of its own:

    /metrics          Prometheus text format (OpenMetrics when asked)
    /-/status         the live status page (master/status_page.py)
    /-/status.json    what that page fetches every second
    /-/ready          the readiness check for a balancer: 200 "ready", or 503
                      and why not (starting, stopping: unready_delay's lame
                      duck); read from the listener's reader thread
                      (inspect.readiness), so it answers at once even while
                      the loop is busy or every pool thread waits on it

The master's loop is single-threaded and owns every figure, so the server
thread never reads the supervisor: it hands the loop a call (run_in_loop)
that takes the master's own view (inspect.snapshot) and starts
inspect.tree(), and waits for the tree on a Future, SCRAPE_TIMEOUT at most.
The tree asks every worker with a deadline (inspect.ASK_TIMEOUT per round,
two rounds), so a stuck worker costs a scrape about four seconds and shows
as `sockherd_worker_answered 0`. Past SCRAPE_TIMEOUT the scrape is answered
with what there is, and `sockherd_scrape_complete 0`: the master's own view
without the workers' figures if the loop ran the call, else (a master stuck
in a long step) only the counters kept here. Scrapes arriving while one
round is out join it: one round of questions for any number of scrapers
and browsers at once (such an answer is as old as that round, a few
milliseconds). Nothing is cached beyond that.

Counters no worker can know, kept here from the master's events
(master/events.py): restarts, i.e. workers that exited while serving
without being told to drain (a crash, a SIGKILL from outside, a heartbeat
lost), by how they ended. A planned drain, a stop, and the workers of a
refused reload are no restarts. Everything else comes from the tree:
reloads from the master's own counts, requests, responses, refused
requests and accept pauses from each worker's "proc" answer (worker/report.py), the fdcore
counters per loop thread from its "activity" answer.

The collector is registered in a registry of its own (never the global
one): importing this module changes nothing until attach() runs.
"""
from __future__ import annotations

import concurrent.futures
import errno
import json
import logging
import socket
import threading
import time

from prometheus_client import make_wsgi_app
from prometheus_client.registry import Collector, CollectorRegistry

from sockherd.master import inspect, status_page
from sockherd.master.addresses import parse
from sockherd.master.metrics_families import families, tls_outcomes  # noqa: F401
from sockherd.master.metrics_http import Listener

log = logging.getLogger("sockherd.master")

SCRAPE_TIMEOUT = 2 * inspect.ASK_TIMEOUT + 1.0  # both rounds of a tree, and some slack
RETRY = 1.0                  # a takeover: the address still the old instance's, try again after


# ---- counters kept from events ---------------------------------------------------------
class Restarts:
    """Counts the workers that exited while serving, unplanned: fed every
    event in the master's loop, read from the server thread (under the lock).

    Planned: a worker told to drain ("draining": a reload, TTOU, a
    max_requests replacement, a stop; killed at hard_stop_after is still
    planned), every exit once the master is stopping, and the workers of a
    refused reload (their generation's "reload_failed": the master kills
    them, READY or not). A worker that never was READY did not serve."""

    def __init__(self, counts: dict | None = None) -> None:
        self._lock = threading.Lock()
        # outcome -> exits; an upgrade's previous image's to begin with
        self.counts: dict[str, int] = {}
        for outcome, n in (counts or {}).items():
            if isinstance(n, int):
                self.counts[str(outcome)] = n
        self._generation: dict[int, int] = {}  # pid -> generation, while alive
        self._ready: set[int] = set()
        self._planned: set[int] = set()
        self._stopping = False

    def on_event(self, ev: dict) -> None:
        kind = ev["event"]
        if kind == "spawned":
            self._generation[ev["pid"]] = int(ev["worker"].split(".")[0])
        elif kind == "ready":
            self._ready.add(ev["pid"])
        elif kind == "draining":
            self._planned.add(ev["pid"])
        elif kind == "stopping":
            self._stopping = True
        elif kind == "reload_failed":
            self._planned.update(pid for pid, gen in self._generation.items()
                                 if gen == ev["generation"])
        elif kind == "exited":
            pid = ev["pid"]
            # a pid never spawned by this image: adopted across an upgrade,
            # which takes only READY workers
            served = pid in self._ready or pid not in self._generation
            planned = pid in self._planned or self._stopping
            self._generation.pop(pid, None)
            self._ready.discard(pid)
            self._planned.discard(pid)
            if served and not planned and ev["outcome"] != "drained":
                with self._lock:
                    self.counts[ev["outcome"]] = self.counts.get(ev["outcome"], 0) + 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


# ---- the tree, from the loop -------------------------------------------------------------
class Gatherer:
    """inspect.tree() from another thread, with a deadline (see the top)."""

    def __init__(self, sup, timeout: float = SCRAPE_TIMEOUT):
        self.sup = sup
        self.timeout = timeout
        self._lock = threading.Lock()
        # the round out: (when it was handed to the loop, snapshot, tree)
        self._round: tuple[float, concurrent.futures.Future,
                           concurrent.futures.Future] | None = None

    def get(self) -> tuple[dict | None, bool]:
        """(tree, complete): complete when the master and every worker
        answered; else the master's view without the workers' figures, or
        None when the master's loop did not even run the call in time."""
        with self._lock:
            # a round is joined while it is out, never past two deadlines
            # (a tree that never came must not pin an old snapshot)
            if self._round is None or self._round[2].done() \
                    or time.monotonic() - self._round[0] > 2 * self.timeout:
                self._round = (time.monotonic(), *self._start())
            _, started, done = self._round
        try:
            tree = done.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            pass
        except Exception:                          # noqa: BLE001 - answered as incomplete
            log.exception("metrics: gathering the tree failed")
        else:
            return tree, all(w.get("stats") is not None and w.get("threads") is not None
                             for w in tree["workers"])
        if started.done() and started.exception() is None:
            snap = started.result()
            for w in snap["workers"]:
                w["stats"] = w["threads"] = None
            return snap, False
        return None, False

    def _start(self):
        started: concurrent.futures.Future = concurrent.futures.Future()
        done: concurrent.futures.Future = concurrent.futures.Future()
        sup = self.sup

        def in_loop() -> None:
            try:
                started.set_result(inspect.snapshot(sup))
                inspect.tree(sup, done.set_result)
            except BaseException as exc:          # reported to the waiting thread
                for fut in (started, done):
                    if not fut.done():
                        fut.set_exception(exc)
                raise
        sup.run_in_loop(in_loop)
        return started, done


# ---- /metrics ----------------------------------------------------------------------------
class TreeCollector(Collector):
    """The tree as metric families, gathered afresh at each collect()."""

    def __init__(self, gatherer: Gatherer, restarts: Restarts):
        self.gatherer = gatherer
        self.restarts = restarts

    def collect(self):
        tree, complete = self.gatherer.get()
        yield from families(tree, complete, self.restarts.snapshot())


# ---- the HTTP side (bounded, with /-/ready off the pool: master/metrics_http.py) ------------
def app(gatherer: Gatherer, restarts: Restarts, readiness):
    """The listener's WSGI app: /metrics, /-/status, /-/status.json, /-/ready
    (readiness() -> (ready, why))."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TreeCollector(gatherer, restarts))
    metrics = make_wsgi_app(registry)

    def route(environ, start_response):
        path = environ.get("PATH_INFO", "")
        method = environ["REQUEST_METHOD"]
        if path in ("/metrics", "/-/status", "/-/status.json", "/-/ready") \
                and method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"),
                                                      ("Content-Type", "text/plain")])
            return [b"GET or HEAD only\n"]
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/-/ready":
            ready, why = readiness()
            body = f"{why}\n".encode()
            start_response("200 OK" if ready else "503 Service Unavailable",
                           [("Content-Type", "text/plain"), ("Cache-Control", "no-store"),
                            ("Content-Length", str(len(body)))])
            return [body if method == "GET" else b""]
        if path in ("/-/status", "/-/status.json"):
            tree, complete = gatherer.get()
            note = "" if complete else ("some workers did not answer in time" if tree
                                        else "the master did not answer in time")
            if path.endswith(".json"):
                body = status_page.document(tree, restarts=restarts.snapshot(),
                                            complete=complete, note=note)
                ctype = "application/json"
            else:
                body = status_page.page(
                    status_page.render(tree, restarts=restarts.snapshot(), note=note),
                    json_url="/-/status.json")
                ctype = "text/html; charset=utf-8"
            start_response("200 OK", [("Content-Type", ctype), ("Cache-Control", "no-store"),
                                      ("Content-Length", str(len(body)))])
            return [body if method == "GET" else b""]
        if path == "/":
            start_response("302 Found", [("Location", "/-/status"),
                                         ("Content-Type", "text/plain")])
            return [b"the status page is at /-/status, the metrics at /metrics\n"]
        body = json.dumps({"error": f"no {path}: try /metrics, /-/status or /-/ready"}).encode()
        start_response("404 Not Found", [("Content-Type", "application/json")])
        return [body]

    return route


class MetricsServer:
    """The listener and its thread; an extra of the supervisor's (no fd in
    the master's selector: in the loop it only retries a busy address and
    closes).

    A takeover (`run --takeover`) starts while the instance it replaces
    still serves the same metrics address: then, and only then, an address
    in use is retried every RETRY seconds until that instance is gone
    (the control endpoint does the same). At any other start it is an
    error: a metrics address taken by somebody else must stop the start."""

    def __init__(self, sup, address: str, restarts: Restarts, *, wait_if_busy: bool = False,
                 inherited: int = -1):
        self.addr = parse(address, scheme_ok=False)
        if self.addr.kind != "tcp":
            raise ValueError(f"metrics {address!r}: expected host:port or [v6]:port")
        self.text = address
        self.restarts = restarts
        self.gatherer = Gatherer(sup)
        self.wsgi = app(self.gatherer, self.restarts, lambda: inspect.readiness(sup))
        self.httpd: Listener | None = None
        self.thread: threading.Thread | None = None
        self._retry_at: float | None = None
        try:
            self._serve(inherited)
        except OSError as exc:
            if not (wait_if_busy and exc.errno == errno.EADDRINUSE):
                raise
            log.warning("%s; listening once the instance taken over is gone", exc)
            self._retry_at = time.monotonic() + RETRY

    @property
    def address(self) -> str:
        port = self.httpd.server_address[1] if self.httpd is not None else self.addr.port
        return str(type(self.addr)("tcp", host=self.addr.host, port=port))

    def _serve(self, inherited: int = -1) -> None:
        """Listens on the address, or on `inherited`: the socket an upgrade's
        previous image served it on (one socket, never refused meanwhile)."""
        try:
            if inherited >= 0:
                self.httpd = Listener.adopt(inherited, self.wsgi)
            else:
                family = socket.getaddrinfo(self.addr.host, self.addr.port,
                                            type=socket.SOCK_STREAM)[0][0]
                self.httpd = Listener.bind(self.addr.host, self.addr.port, family, self.wsgi)
        except OSError as exc:
            raise OSError(exc.errno, f"metrics: cannot listen on {self.text}: "
                                     f"{exc.strerror or exc}") from None
        self._accept()
        log.info("metrics on http://%s/metrics, status page on http://%s/-/status",
                 self.address, self.address)

    # the supervisor's extra interface
    def fds(self) -> list[int]:
        return []

    def exec_fd(self) -> int:
        """The listening socket an upgrade carries across its exec (ipc.reexec)."""
        return self.httpd.socket.fileno() if self.httpd is not None else -1

    def before_exec(self) -> None:
        """Right before an upgrade's exec: stop accepting (the socket stays
        open and keeps queueing for the new image) and let the requests in
        flight end, so a probe is answered, never reset by the exec."""
        if self.thread is None:
            return
        self.httpd.shutdown(drain=1.0)        # a probe's head already read is answered
        self.thread.join(5)
        self.thread = None
        if not self.httpd.quiesce(1.0):
            log.warning("metrics: a request still in flight at the exec")

    def exec_failed(self) -> None:
        """The exec did not happen: serve on, on the same socket."""
        if self.httpd is not None and self.thread is None:
            self._accept()

    def _accept(self) -> None:
        """The thread that accepts and serves (until httpd.shutdown())."""
        self.thread = self.httpd.start()

    def poll(self) -> None:
        if self._retry_at is None or time.monotonic() < self._retry_at:
            return
        try:
            self._serve()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                log.error("%s; no metrics", exc)
                self._retry_at = None
                return
            self._retry_at = time.monotonic() + RETRY
            return
        self._retry_at = None

    def next_deadline(self) -> float | None:
        return self._retry_at

    def close(self) -> None:
        self._retry_at = None
        if self.thread is None:
            return
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
        self.thread = None


def attach(sup) -> None:
    """Counts the restarts (sup.restarts, from an upgrade's previous image's
    counts), and serves the metrics and the status page on
    sup.settings.metrics if set, and wherever a reload sets it later
    (Follower). Raises OSError (the address cannot be bound: the message
    names it) or ValueError (not a host:port)."""
    sup.restarts = Restarts(sup.carried.get("restarts"))
    sup.events.subscribe(sup.restarts.on_event)
    follower = Follower(sup)
    address = sup.settings.metrics
    # an upgrade's socket: kept if still asked for, else closed
    inherited = _inherited(sup, address)
    if address:
        # on_serving is set for a takeover only (master/cli.py): tell the old
        # instance to go once we serve
        follower.start(address, wait_if_busy=sup.on_serving is not None, inherited=inherited)
    sup.events.subscribe(follower.on_event)


class Follower:
    """The metrics listener where the serving generation's settings say:
    when a reload commits (reload_ok, in the master's loop: sup.settings is
    the new generation's then), one at a new address is started before the
    old one closes (so an address that cannot be bound leaves the old one
    serving, said in the log; the same port spelled otherwise is one), one
    removed from the settings is closed. The restart counts
    are the master's (sup.restarts): they go on across the move."""

    def __init__(self, sup):
        self.sup = sup
        self.server: MetricsServer | None = None

    def start(self, address: str, **kw) -> None:
        self.server = MetricsServer(self.sup, address, self.sup.restarts, **kw)
        self.sup.add_extra(self.server)

    def on_event(self, ev: dict) -> None:
        if ev["event"] != "reload_ok":
            return
        want, old = self.sup.settings.metrics, self.server
        if want == (old.text if old is not None else ""):
            return
        new = None
        if want:
            try:
                new = MetricsServer(self.sup, want, self.sup.restarts)
            except (OSError, ValueError) as exc:
                # (the same port spelled otherwise is in use too: by the old one)
                log.error("%s; %s", exc, f"the metrics stay on {old.text}" if old is not None
                          else "no metrics")
                return
        if old is not None:
            self.sup.extras.remove(old)
            old.close()
            log.info("metrics: no longer on %s (generation %d's settings)", old.text,
                     self.sup.generation)
        self.server = new
        if new is not None:
            self.sup.add_extra(new)


def _inherited(sup, address: str) -> int:
    """The metrics socket of the previous image (an upgrade), if it listens
    where the settings say; one that does not is closed (the port may be
    asked again)."""
    state = sup.adopted
    fd = state.metrics_fd if state is not None else -1
    if fd < 0:
        return -1
    sock = socket.socket(fileno=fd)
    try:
        bound = sock.getsockname()[:2]
        want = parse(address, scheme_ok=False)
        same = bound[1] == want.port and any(
            info[4][:2] == bound for info in socket.getaddrinfo(
                want.host, want.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE))
    except (OSError, ValueError):
        same = False
    if same and address:
        sock.detach()
        return fd
    sock.close()
    return -1
