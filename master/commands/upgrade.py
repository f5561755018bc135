"""upgrade: the master re-executes itself (new code, new Python), like
SIGUSR2. The reply comes right before the exec (this image ends there);
`sockherd ctl upgrade` then asks the new image until its new generation
serves, so the command as a whole is synchronous. A refused or failed
upgrade answers with the reason at once, and this master carries on."""
import os

from sockherd.master.commands import Command


def run(sup, args, reply) -> None:
    before = {"pid": os.getpid(), "generation": sup.generation,
              "reloads_failed": sup.reloads_failed, "upgrades_failed": sup.upgrades_failed}
    why = sup._upgrade(before_exec=lambda: reply.ok({"upgrading": True, **before}))
    if why:
        reply.fail(why)


def render(r: dict) -> str:
    if r.get("upgrading"):
        return f"upgrade: re-executing master pid {r['pid']}"
    return (f"upgrade: master pid {r['pid']} (same), generation {r['generation']} serving "
            f"(ready in {r['seconds']:.2f}s)")


COMMAND = Command("upgrade", "re-execute the master in place (new code, new Python); answers "
                  "when the new generation serves or with why not", run, render, timeout=300.0)
