"""show proc [--threads]: the master and every worker with its figures
(each worker is asked: requests, connections, open WebSockets, threads
and how many of them are alive; with TLS on, its handshakes: completed,
resumed among them, failed); with --threads also
each worker's loop threads and their counters (the status pages' tree)."""
import msgspec

from sockherd.master.commands import Command, duration, table
from sockherd.master.inspect import tree


class Args(msgspec.Struct, forbid_unknown_fields=True):
    threads: bool = False


def run(sup, args: Args, reply) -> None:
    tree(sup, reply.ok, activity=args.threads)


def render(r: dict) -> str:
    m = r["master"]
    rows = [{"worker": "master", "pid": m["pid"], "state": "stopping" if m["stopping"]
             else "running", "role": f"generation {m['generation']}", "uptime": duration(m["uptime"])}]
    tls = False
    for w in r["workers"]:
        st = w.get("stats") or {}
        counts = st.get("tls")
        if counts:
            tls = True
            w = {**w, "handshakes": counts["handshakes"], "resumed": counts["resumed"],
                 "tls_failed": counts["handshake_failed"]}
        rows.append({**w, "uptime": duration(w["uptime"]), "requests": st.get("requests"),
                     "connections": st.get("connections", w["connections"]),
                     "websockets": st.get("websockets"),
                     "threads": st.get("threads"), "alive": st.get("threads_alive"),
                     "answered": "yes" if w.get("stats") else "no"})
    out = table(rows, ["worker", "pid", "state", "role", "uptime", "requests", "connections",
                       "websockets", "threads", "alive", "answered"]
                + (["handshakes", "resumed", "tls_failed"] if tls else []))
    out += (f"\nreloads: {m['reloads_ok']} ok, {m['reloads_failed']} failed"
            + (f" (last: {m['last_reload_failure']})" if m["last_reload_failure"] else ""))
    return out


COMMAND = Command("show proc", "the master and every worker: generation, pid, state, uptime, "
                  "requests, connections; reloads (--threads: each worker's threads too)",
                  run, render, Args, timeout=5.0)
