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
from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from sockherd.master import inspect, status_page
from sockherd.master.addresses import parse
from sockherd.master.metrics_http import Listener

log = logging.getLogger("sockherd.master")

SCRAPE_TIMEOUT = 2 * inspect.ASK_TIMEOUT + 1.0  # both rounds of a tree, and some slack
RETRY = 1.0                  # a takeover: the address still the old instance's, try again after
ROLES = ("starting", "serving", "replacing", "previous", "draining", "stopping")
WORKER_LABELS = ("generation", "worker", "pid")
THREAD_LABELS = WORKER_LABELS + ("thread", "tgid")


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


def families(tree: dict | None, complete: bool, restarts: dict[str, int]):
    """The metric families of one tree (pure: unit-tested without a master)."""
    g = GaugeMetricFamily("sockherd_scrape_complete",
                          "1 when the master and every worker answered this scrape in time")
    g.add_metric([], 1 if complete else 0)
    yield g
    c = CounterMetricFamily("sockherd_worker_restarts",
                            "workers that exited while serving without being told to drain "
                            "(respawned by the master), by how they ended", labels=["outcome"])
    for outcome in sorted(set(restarts) | {"crashed", "killed"}):
        c.add_metric([outcome], restarts.get(outcome, 0))
    yield c
    if tree is None:
        return
    m = tree["master"]
    g = GaugeMetricFamily("sockherd_master_generation", "the serving generation")
    g.add_metric([], m["generation"])
    yield g
    g = GaugeMetricFamily("sockherd_master_uptime_seconds", "since this master image started")
    g.add_metric([], m["uptime"])
    yield g
    for key, doc in (("reloads_ok", "reloads whose new generation serves"),
                     ("reloads_failed", "reloads refused (the old generation kept serving)"),
                     ("upgrades_failed", "upgrades that failed (refused or failed exec: the "
                      "image carried on; failed after the exec: the previous image came back)")):
        c = CounterMetricFamily(f"sockherd_{key}", doc + " since the master started "
                                "(carried across upgrades)")
        c.add_metric([], m[key])
        yield c
    c = CounterMetricFamily("sockherd_reloads_rolled_back", "reloads whose new generation "
                            "failed on probation: the previous one serves again (counted in "
                            "reloads_failed too)")
    c.add_metric([], m.get("reloads_rolled_back", 0))
    yield c
    # a slot that keeps failing is never given up on (issue 19 §7): it backs off, seen here
    g = GaugeMetricFamily("sockherd_worker_slots_backing_off", "serving slots with no worker, "
                          "waiting for a respawn after failures in a row")
    g.add_metric([], len(m.get("backing_off", [])))
    yield g
    g = GaugeMetricFamily("sockherd_worker_slot_failures", "failures in a row of a serving "
                          "slot backing off", labels=["slot"])
    for b in m.get("backing_off", []):
        g.add_metric([str(b["slot"])], b["failures"])
    yield g
    roles = {r: 0 for r in ROLES}
    for w in tree["workers"]:
        roles[w["role"]] = roles.get(w["role"], 0) + 1
    g = GaugeMetricFamily("sockherd_workers", "live workers by role (draining: told to drain, "
                          "finishing their connections)", labels=["role"])
    for role, n in roles.items():
        g.add_metric([role], n)
    yield g

    info = InfoMetricFamily("sockherd_worker", "a live worker's role and lifecycle state",
                            labels=WORKER_LABELS)
    answered = GaugeMetricFamily("sockherd_worker_answered",
                                 "1 if the worker answered this scrape in time",
                                 labels=WORKER_LABELS)
    uptime = GaugeMetricFamily("sockherd_worker_uptime_seconds", "since the worker was spawned",
                               labels=WORKER_LABELS)
    conns = GaugeMetricFamily("sockherd_worker_connections", "open connections",
                              labels=WORKER_LABELS)
    # issue 23: an ASGI worker's open WebSockets (they hold a drain until hard_stop_after)
    websockets = GaugeMetricFamily("sockherd_worker_websockets", "open WebSockets (ASGI)",
                                   labels=WORKER_LABELS)
    requests = CounterMetricFamily("sockherd_worker_requests", "HTTP requests answered",
                                   labels=WORKER_LABELS)
    responses = CounterMetricFamily("sockherd_worker_responses",
                                    "HTTP responses by status class",
                                    labels=WORKER_LABELS + ("class",))
    pauses = CounterMetricFamily("sockherd_worker_accept_pauses",
                                 "times the worker stopped accepting: emfile (out of file "
                                 "descriptors) or max_connections (its cap reached)",
                                 labels=WORKER_LABELS + ("reason",))
    alive = GaugeMetricFamily("sockherd_worker_loop_threads_alive",
                              "loop threads running (fewer than configured: one ended, the "
                              "worker drains to be replaced)", labels=WORKER_LABELS)
    tls = CounterMetricFamily("sockherd_worker_tls_handshakes",
                              "TLS handshakes by outcome: full, resumed (a session resumed), "
                              "failed (a TLS error, logged), abandoned (begun, then closed "
                              "before its end with no TLS error: the client left or reset, "
                              "or header_timeout or a drain closed it), plain_http (plain "
                              "HTTP sent to a TLS port, answered 400)", labels=WORKER_LABELS + ("outcome",))
    refused = CounterMetricFamily("sockherd_http_rejected",
                                  "requests the engine refused itself (its own 400, 408, 413, "
                                  "414, 431, 500, 505), by reason", labels=WORKER_LABELS + ("reason",))
    threads: dict[str, CounterMetricFamily] = {}
    for w in tree["workers"]:
        labels = [str(w["generation"]), w["worker"], str(w["pid"])]
        info.add_metric(labels, {"role": w["role"], "state": w["state"]})
        uptime.add_metric(labels, w["uptime"])
        stats = w.get("stats")
        answered.add_metric(labels, 0 if stats is None else 1)
        if stats is None:
            if w.get("connections") is not None:       # the balance board's count
                conns.add_metric(labels, w["connections"])
        else:
            conns.add_metric(labels, stats["connections"])
            if stats.get("websockets") is not None:
                websockets.add_metric(labels, stats["websockets"])
            if stats.get("requests") is not None:
                requests.add_metric(labels, stats["requests"])
            for cls, n in (stats.get("responses") or {}).items():
                responses.add_metric(labels + [cls], n)
            for why, n in (stats.get("accept_pauses") or {}).items():
                pauses.add_metric(labels + [why], n)
            if stats.get("threads_alive") is not None:
                alive.add_metric(labels, stats["threads_alive"])
            for why, n in (stats.get("refused") or {}).items():
                refused.add_metric(labels + [why], n)
            for outcome, n in tls_outcomes(stats.get("tls")):
                tls.add_metric(labels + [outcome], n)
        for th in w.get("threads") or ():
            tl = labels + [str(th["tid"]), str(th["tgid"])]
            for name, value in th.items():
                if name in ("tid", "tgid"):
                    continue
                fam = threads.get(name)
                if fam is None:
                    fam = threads[name] = CounterMetricFamily(
                        f"sockherd_thread_{name}", f"fdcore counter {name} of a loop thread "
                        "(`sockherd ctl show activity`)", labels=THREAD_LABELS)
                fam.add_metric(tl, value)
    yield from (info, answered, uptime, conns, websockets, requests, responses, pauses, alive,
                refused, tls)
    yield from threads.values()


def tls_outcomes(counts: dict | None) -> list[tuple[str, int]]:
    """A worker's TLS counts (worker/report.py) as (outcome, n): full and
    resumed add up to the handshakes completed; none when TLS is off."""
    if not counts:
        return []
    return [("full", counts["handshakes"] - counts["resumed"]), ("resumed", counts["resumed"]),
            ("failed", counts["handshake_failed"]), ("abandoned", counts["handshake_abandoned"]),
            ("plain_http", counts["plain_refused"])]


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
