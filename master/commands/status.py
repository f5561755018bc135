"""status: the master in one screen: generation, workers by role, reloads."""
from sockherd.master.commands import Command
from sockherd.master.inspect import snapshot


def run(sup, args, reply) -> None:
    snap = snapshot(sup)
    roles: dict[str, int] = {}
    for w in snap["workers"]:
        roles[w["role"]] = roles.get(w["role"], 0) + 1
    reply.ok({**snap["master"], "roles": roles})


def render(r: dict) -> str:
    roles = ", ".join(f"{n} {role}" for role, n in sorted(r["roles"].items())) or "none"
    pr = r.get("probation")
    lines = [
        f"master pid {r['pid']}, up {r['uptime']:.0f}s, generation {r['generation']}"
        + (f" (generation {r['starting_generation']} starting)" if r["starting_generation"]
           else "")
        + (f" (on probation, {pr['left']:.0f}s left; generation {pr['previous']} stands by "
           f"until then, not accepting)" if pr else "")
        + (", stopping" if r["stopping"] else ""),
        f"workers: {r['workers']} wanted; live: {roles}",
        f"reloads: {r['reloads_ok']} ok, {r['reloads_failed']} failed"
        + (f" ({r['reloads_rolled_back']} rolled back)" if r.get("reloads_rolled_back") else "")
        + (f" (last: {r['last_reload_failure']})" if r["last_reload_failure"] else ""),
        f"listening on: {', '.join(r['listeners']) or 'nothing'}",
    ]
    # a slot that keeps failing is never given up on: it shows here until it serves again
    lines += [f"worker slot {b['slot']}: backing off, {b['failures']} failures in a row, next "
              f"try in {b['next_try_in']:.0f}s" for b in r.get("backing_off", [])]
    if not r.get("ready", True) and not r["stopping"]:
        lines.append("not ready: /-/ready answers 503")
    return "\n".join(lines)


COMMAND = Command("status", "the master: generation, workers by role, reloads", run, render,
                  timeout=5.0)
