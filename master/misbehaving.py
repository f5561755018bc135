"""What the master does with a worker that misbehaves (issue 19 §1).

A worker's message that is illegal for its lifecycle state (a second READY,
a FailedBeforeReady after READY: app code can write on its worker's
socketpair, and a bug of ours could send one twice) is never trusted and
never allowed to end the master's loop: the lifecycle refuses it
(IllegalTransition, nothing changed) and `verdict` decides what follows.
Pure: the supervisor logs and carries it out.
"""
from __future__ import annotations

from sockherd.master.generations import replace_refusal
from sockherd.master.lifecycle import State
from sockherd.master.workers import Slot

REPLACE = "replace"      # a new worker READY first, then the offender drains
DRAIN = "drain"          # cannot be replaced now: it drains (its slot's exit policy follows)
LEAVE = "leave"          # leaving already, or its replacement is starting

SHOWN = 200              # characters of the offending message in the log (a reason can be long)
LOG_EVERY = 60.0         # seconds between two lines about one worker's later offences


def to_log(slot: Slot, kind: str, now: float) -> int:
    """Counts one offence of slot's worker (kind: the message's type, or
    its channel breaking); how many to tell in the log now (0: nothing).
    The first of each kind is told at once, repeats are counted and told
    at most every LOG_EVERY seconds: a worker writing illegal messages as
    fast as it can made one line each, 14,534 in a second (review of issue 19)."""
    slot.offences += 1
    if kind not in slot.offence_kinds:
        slot.offence_kinds.add(kind)
    elif now - slot.offence_logged_at < LOG_EVERY:
        return 0
    told, slot.offences_logged = slot.offences - slot.offences_logged, slot.offences
    slot.offence_logged_at = now
    return told


def verdict(slot: Slot, serving: list[Slot], stopping: bool, pending) -> tuple[str, str]:
    """(what to do with slot's misbehaving worker, why not replace it: "" if replaced)."""
    refusal = replace_refusal(slot, serving, stopping, pending)
    if not refusal:
        return REPLACE, ""
    if slot.proc is not None and slot.life is not None and slot.life.state is State.READY \
            and slot.replaced_by is None and not stopping:
        return DRAIN, refusal
    return LEAVE, refusal


def shown(msg) -> str:
    """The offending message as the log shows it, cut to SHOWN characters."""
    text = repr(msg)
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."
