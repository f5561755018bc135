"""show proc: the master and every worker with its figures (each worker is
asked: requests, connections, threads)."""
from sockherd.master.commands import Command, table
from sockherd.master.inspect import tree


def run(sup, args, reply) -> None:
    tree(sup, reply.ok, activity=False)


def render(r: dict) -> str:
    m = r["master"]
    rows = [{"worker": "master", "pid": m["pid"], "state": "stopping" if m["stopping"]
             else "running", "role": f"generation {m['generation']}", "uptime": m["uptime"]}]
    for w in r["workers"]:
        st = w.get("stats") or {}
        rows.append({**w, "requests": st.get("requests"),
                     "connections": st.get("connections", w["connections"]),
                     "threads": st.get("threads"),
                     "answered": "yes" if w.get("stats") else "no"})
    out = table(rows, ["worker", "pid", "state", "role", "uptime", "requests", "connections",
                       "threads", "answered"])
    out += (f"\nreloads: {m['reloads_ok']} ok, {m['reloads_failed']} failed"
            + (f" (last: {m['last_reload_failure']})" if m["last_reload_failure"] else ""))
    return out


COMMAND = Command("show proc", "the master and every worker: generation, pid, state, uptime, "
                  "requests, connections; reloads", run, render, timeout=5.0)
