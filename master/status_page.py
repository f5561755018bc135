"""The live status page: the master's tree as HTML, for a browser.

    master -> generations -> workers -> thread groups -> threads

from the dict master/inspect.py's tree() gives (`sockherd ctl show proc`
prints the same dict). Served by the metrics listener at /-/status
(master/metrics.py) and by the embedded default app at / (worker/embedded.py).

One renderer, in Python: the page is complete HTML as sent (it reads with
JavaScript off, and a <noscript> meta refresh reloads it every few
seconds), and its small script fetches the JSON endpoint every second and
swaps in the fragment the JSON carries next to the data ("html"), so the
tree lives without the page ever being reloaded and no JavaScript framework
or second renderer in JavaScript is needed. A fetch that fails leaves the
last tree in place and says so at the top.

Pure: no I/O, no master state; everything is escaped here.
"""
from __future__ import annotations

import html
import json
import time

from sockherd.master.commands import duration

REFRESH_MS = 1000          # the script's period
NOSCRIPT_REFRESH_S = 5     # the plain-HTML fallback's
CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx", "other")


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _worker(w: dict) -> str:
    stats = w.get("stats")
    threads = w.get("threads")
    role = w.get("role", "?")
    head = (f'<span class="name">worker {_e(w.get("worker"))}, pid {_e(w.get("pid"))}</span> '
            f'<span class="role role-{_e(role)}">{_e(role)}</span> '
            f'· up {duration(w.get("uptime"))}')
    if stats is None:
        body = '<p class="late">did not answer in time</p>'
        conns = w.get("connections")
        if conns is not None:
            head += f" · {_e(conns)} connections (balance board)"
    else:
        head += f' · <span class="conns">{_e(stats.get("connections"))}</span> connections'
        parts = []
        if stats.get("requests") is not None:
            parts.append(f'<span class="requests">{_e(stats["requests"])}</span> requests')
        responses = stats.get("responses") or {}
        shown = [f"{k} {_e(responses[k])}" for k in CLASSES if responses.get(k)]
        if responses:
            parts.append("responses " + (", ".join(shown) or "none"))
        pauses = stats.get("accept_pauses") or {}
        if any(pauses.values()):
            parts.append("accept paused " + ", ".join(
                f"{_e(n)}× {_e(why)}" for why, n in pauses.items() if n))
        if stats.get("draining"):
            parts.append("draining")
        body = f'<p class="figures">{" · ".join(parts)}</p>' if parts else ""
        if threads is None:
            body += '<p class="late">thread counters: no answer in time</p>'
        else:
            body += _groups(threads)
    return (f'<li class="worker" data-worker="{_e(w.get("worker"))}" data-pid="{_e(w.get("pid"))}"'
            f' data-role="{_e(role)}"><div class="head">{head}</div>{body}</li>')


def _groups(threads: list) -> str:
    by_group: dict[int, list] = {}
    for th in threads:
        by_group.setdefault(th.get("tgid", 0), []).append(th)
    # the counters as the workers name them (fdcore's COUNTERS), in their order
    names = [k for k in (threads[0] if threads else {}) if k not in ("tid", "tgid")]
    cols = "".join(f"<th>{_e(n)}</th>" for n in names)
    out = ['<ul class="groups">']
    for tgid, members in sorted(by_group.items()):
        rows = "".join(
            f'<tr class="thread" data-tid="{_e(th.get("tid"))}"><th>thread {_e(th.get("tid"))}</th>'
            + "".join(f"<td>{_e(th.get(n, ''))}</td>" for n in names) + "</tr>"
            for th in sorted(members, key=lambda t: t.get("tid", 0)))
        out.append(f'<li class="group" data-tgid="{_e(tgid)}">thread group {_e(tgid)}'
                   f'<table><thead><tr><th></th>{cols}</tr></thead><tbody>{rows}</tbody>'
                   f'</table></li>')
    out.append("</ul>")
    return "".join(out)


def render(tree: dict | None, *, restarts: dict | None = None, note: str = "") -> str:
    """The tree as an HTML fragment (what the script swaps in)."""
    if tree is None:
        return f'<p class="late">{_e(note or "the master did not answer in time")}</p>'
    m = tree.get("master") or {}
    facts = [f'<span class="name">master pid {_e(m.get("pid", "?"))}</span>']
    if m.get("uptime") is not None:
        facts.append(f"up {duration(m['uptime'])}")
    if m.get("generation") is not None:
        facts.append(f"generation {_e(m['generation'])} serving")
    if m.get("starting_generation"):
        facts.append(f"generation {_e(m['starting_generation'])} starting")
    if m.get("reloads_ok") is not None:
        facts.append(f"reloads {_e(m['reloads_ok'])} ok, {_e(m.get('reloads_failed', 0))} refused")
    if restarts is not None:
        facts.append(f"{sum(restarts.values())} restarts")
    if m.get("stopping"):
        facts.append("stopping")
    listeners = m.get("listeners")
    extra = ""
    if listeners:
        extra += f'<p class="figures">listening on {_e(", ".join(map(str, listeners)))}</p>'
    if m.get("last_reload_failure"):
        extra += f'<p class="late">last refused reload: {_e(m["last_reload_failure"])}</p>'
    if note:
        extra += f'<p class="note">{_e(note)}</p>'
    gens: dict[int, list] = {}
    for w in tree.get("workers") or []:
        gens.setdefault(w.get("generation", 0), []).append(w)
    items = []
    for gen, workers in sorted(gens.items()):
        roles: dict[str, int] = {}
        for w in workers:
            roles[w.get("role", "?")] = roles.get(w.get("role", "?"), 0) + 1
        summary = ", ".join(f"{n} {_e(r)}" for r, n in sorted(roles.items()))
        items.append(f'<li class="generation" data-generation="{_e(gen)}">'
                     f'<div class="head"><span class="name">generation {_e(gen)}</span> '
                     f'({summary})</div><ul class="workers">'
                     + "".join(_worker(w) for w in workers) + "</ul></li>")
    if not items:
        items.append('<li class="late">no worker alive</li>')
    return (f'<ul class="tree"><li class="master" data-pid="{_e(m.get("pid", ""))}">'
            f'<div class="head">{" · ".join(facts)}</div>{extra}'
            f'<ul class="generations">{"".join(items)}</ul></li></ul>')


def document(tree: dict | None, *, restarts: dict | None = None, complete: bool = True,
             note: str = "") -> bytes:
    """The JSON endpoint's body: the data, and the fragment rendered from it."""
    return json.dumps({
        "time": round(time.time(), 3), "complete": complete, "tree": tree,
        "restarts": restarts, "html": render(tree, restarts=restarts, note=note),
    }, default=str).encode()


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1em 2em;color:#222}
h1{font-size:1.3em;margin:0 0 .2em}
#live{font-size:smaller;color:#666;margin:0 0 1em}
#live.stale{color:#b00}
ul{list-style:none;padding-left:1.4em;margin:.2em 0}
ul.tree{padding-left:0}
li{margin:.3em 0}
.head{margin:.2em 0}
.name{font-weight:600}
.role{border-radius:3px;padding:0 .4em;background:#eee}
.role-serving{background:#d8f0d8}.role-starting,.role-replacing{background:#dde8f8}
.role-draining,.role-stopping{background:#f8e8c8}
.figures,.note{margin:.1em 0;color:#444}.late{color:#b00;margin:.1em 0}
li.generation{border-left:3px solid #ccd;padding-left:.6em}
table{border-collapse:collapse;font-size:12px;margin:.2em 0}
td,th{border:1px solid #ddd;padding:1px 6px;text-align:right;font-variant-numeric:tabular-nums}
thead th{background:#f4f4f4;font-weight:500}
"""

_SCRIPT = """
(function () {
  var url = document.documentElement.getAttribute("data-json");
  var tree = document.getElementById("tree"), live = document.getElementById("live");
  function say(text, stale) { live.textContent = text; live.className = stale ? "stale" : ""; }
  function tick() {
    fetch(url, {cache: "no-store", headers: {"Accept": "application/json"}})
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(function (d) {
        tree.innerHTML = d.html;
        say("live: updated " + new Date(d.time * 1000).toLocaleTimeString() +
            (d.complete ? "" : " (some workers did not answer in time)"), !d.complete);
      })
      .catch(function (e) { say("not updated since the last refresh: " + e.message, true); })
      .finally(function () { window.setTimeout(tick, %d); });
  }
  window.setTimeout(tick, %d);
})();
""" % (REFRESH_MS, REFRESH_MS)


def page(fragment: str, *, json_url: str, subtitle: str = "") -> bytes:
    """The whole page around a fragment from render()."""
    sub = f"<p>{_e(subtitle)}</p>" if subtitle else ""
    return f"""<!doctype html>
<html lang="en" data-json="{_e(json_url)}"><head><meta charset="utf-8">
<title>sockherd status</title>
<noscript><meta http-equiv="refresh" content="{NOSCRIPT_REFRESH_S}"></noscript>
<style>{_STYLE}</style></head>
<body><h1>sockherd</h1>{sub}
<p id="live">as of {_e(time.strftime("%H:%M:%S"))}<noscript>; this page reloads every
{NOSCRIPT_REFRESH_S}s</noscript></p>
<div id="tree">{fragment}</div>
<script>{_SCRIPT}</script>
</body></html>
""".encode()
