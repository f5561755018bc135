"""The metric families of one tree of the master and its workers (pure:
unit-tested without a master): what /metrics says (master/metrics.py serves
it, gathering the tree afresh at each scrape).
"""
from __future__ import annotations

from prometheus_client.core import (
    CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily,
)
from prometheus_client.utils import floatToGoString

ROLES = ("starting", "serving", "replacing", "previous", "draining", "stopping")
WORKER_LABELS = ("generation", "worker", "pid")
THREAD_LABELS = WORKER_LABELS + ("thread", "tgid")


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
    durations = HistogramMetricFamily(
        "sockherd_worker_request_duration_seconds",
        "the app's requests by duration, from the app's call to the end of its response (the "
        "client gone before included; the engine's own refusals not), with prometheus_client's "
        "default buckets", labels=WORKER_LABELS)
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
            hist = histogram(stats.get("durations"))
            if hist is not None:
                durations.add_metric(labels, *hist)
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
                refused, tls, durations)
    yield from threads.values()


def histogram(d: dict | None) -> tuple[list[tuple[str, int]], float] | None:
    """A worker's duration counts (worker/report.py: per bucket) as
    prometheus_client's buckets (cumulative, +Inf last) and sum; None
    when it has none (or a shape no engine of ours gives)."""
    if not d or len(d.get("counts", ())) != len(d.get("bounds", ())) + 1:
        return None
    buckets, total = [], 0
    for bound, n in zip([*d["bounds"], None], d["counts"]):
        total += n
        buckets.append(("+Inf" if bound is None else floatToGoString(bound), total))
    return buckets, d["sum"]


def tls_outcomes(counts: dict | None) -> list[tuple[str, int]]:
    """A worker's TLS counts (worker/report.py) as (outcome, n): full and
    resumed add up to the handshakes completed; none when TLS is off."""
    if not counts:
        return []
    return [("full", counts["handshakes"] - counts["resumed"]), ("resumed", counts["resumed"]),
            ("failed", counts["handshake_failed"]), ("abandoned", counts["handshake_abandoned"]),
            ("plain_http", counts["plain_refused"])]
