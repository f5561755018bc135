"""master/inspect.py's Asker: a round never takes the master down, whatever
state the workers it names are in (CI found the master crashing: a round
settled inside a reap asked the worker just reaped, on its closed channel)."""
from __future__ import annotations

import socket
from types import SimpleNamespace

from sockherd.ipc.channel import Channel
from sockherd.ipc.messages import StatsReply, StatsRequest
from sockherd.master.inspect import Asker


def _slot(pid: int):
    a, b = socket.socketpair()
    return SimpleNamespace(proc=SimpleNamespace(pid=pid, channel=Channel(a))), Channel(b)


def test_a_round_skips_a_worker_whose_channel_is_closed():
    live, live_peer = _slot(101)
    dead, dead_peer = _slot(102)
    dead.proc.channel.close()                       # reaped: the master closed its end
    got = []
    asker = Asker()
    asker.ask([live, dead], "proc", got.append)
    msg = live_peer.recv(timeout=5).msg
    assert isinstance(msg, StatsRequest)
    asker.on_reply(StatsReply(request_id=msg.request_id, stats={"requests": 1}))
    assert got == [{101: {"requests": 1}}]
    live_peer.close()
    dead_peer.close()
    live.proc.channel.close()


def test_a_callback_that_asks_a_gone_worker_again_does_not_raise():
    """gone() settles a round inside the reap; its callback asks the same
    worker again (inspect.tree's second round): no exception escapes."""
    slot, peer = _slot(201)
    asker = Asker()
    seen = []

    def again(answers):
        seen.append(answers)
        asker.ask([slot], "activity", seen.append)

    asker.ask([slot], "proc", again)
    slot.proc.channel.close()
    asker.gone(201)
    assert seen == [{201: None}, {}]              # asked nobody: answered at once
    peer.close()


def test_a_failing_callback_is_logged_not_raised(caplog):
    slot, peer = _slot(301)
    asker = Asker()
    asker.ask([slot], "proc", lambda answers: 1 / 0)
    asker.gone(301)
    assert "a worker figures callback failed" in caplog.text
    peer.close()
    slot.proc.channel.close()
