"""A worker cannot fill the master's fd table through its channel
(adversarial review of issue 19: the master's end of every worker
socketpair took fds, though no worker message ever carries any. App code
wrote one message frame announcing 65536 fds and then fd batches of 252
copies of one /dev/null fd, without waiting for ACKs; the master installed
every one of them, held them in the half-received message and reached
19,936 of its 20,000 fds in a moment; the worker went quiet and the master
kept them until the heartbeat timeout killed it (15 s), and its
replacement could do it again. Near its limit a master cannot accept a
control client, spawn a worker or answer /-/ready (issue 19 §3).)

Now the master gives a worker's channel no room for ancillary data: the
kernel discards whatever fds a worker passes (MSG_CTRUNC), its channel is
broken and it is replaced as misbehaving, and the master's fd count does
not move."""
from __future__ import annotations

import os

import pytest

from test_control_odd_and_concurrent_requests import Client
from test_run import children, gone, master, wait_for  # noqa: F401 (fixture)
from test_worker_replaced_when_a_loop_thread_ends import get

pytestmark = pytest.mark.timeout(120)

NOFILE = 2048

# App code that silences its worker's own channel code (no heartbeat frame
# may break the message in progress, no ACK of the master's is read as
# unexpected: the worker stays alive and quiet), then passes fds on the
# channel's socket until the master has more than its limit's worth or the
# master closes it. Answers "batches sent, most master fds seen".
FDAPP = """
import gc, os, socket, struct, time
from sockherd.ipc import messages
from sockherd.ipc.channel import Channel
from sockherd.ipc.frames import HEADER, KIND_FDS, KIND_MSG, MAGIC, VERSION

def master_fds():
    return len(os.listdir(f"/proc/{os.getppid()}/fd"))

def flood(limit):
    ch = next(o for o in gc.get_objects() if isinstance(o, Channel))
    ch.read_available = lambda: 0
    ch.next_message = lambda: None
    ch.send = lambda *a, **k: None
    s = socket.socket(fileno=os.dup(ch.fileno()))
    s.setblocking(True)
    payload = messages.encode(messages.Heartbeat(seq=1, sent_at=0.0))
    fd = os.open("/dev/null", os.O_RDONLY)
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("252i", *[fd] * 252))]
    most, batches = master_fds(), 0
    frame = HEADER.pack(MAGIC, VERSION, KIND_MSG, 65536, len(payload)) + payload
    try:
        while batches * 252 < limit + 500:
            s.sendmsg([frame], rights)
            frame = HEADER.pack(MAGIC, VERSION, KIND_FDS, 252, 0)
            batches += 1
            time.sleep(0.002)                    # paced: the master reads them
            most = max(most, master_fds())
    except OSError:
        pass                                     # the master closed the channel
    most = max(most, master_fds())
    s.detach()
    os.close(fd)
    return batches, most

def app(environ, start_response):
    body = b"%d" % os.getpid()
    if environ["PATH_INFO"] == "/fds":
        body = b"%d %d %d" % ((os.getpid(),) + flood(int(environ["QUERY_STRING"])))
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body]
"""


def test_fds_a_worker_passes_on_its_channel_never_enter_the_master(master, tmp_path):
    """Finding (review of issue 19): a worker passing fds on its channel.
    The master's fd count stays where it was, the worker is replaced as
    misbehaving (its channel broke), and the master serves and answers on."""
    (tmp_path / "fdapp.py").write_text(FDAPP)
    m = master("fdapp:app", "-w", "2", "--hard-stop-after", "2", nofile=NOFILE)
    pid = m.proc.pid
    before = len(os.listdir(f"/proc/{pid}/fd"))
    victim, batches, most = map(int, get(m.port, f"/fds?{NOFILE}").split())
    print(f"{batches} batches of 252 fds passed; master fds {before} before, {most} at most")
    assert most < before + 32, f"the master held {most} fds ({before} before)"
    m.wait_log(rf"worker \d+\.\d+ \(pid {victim}\) misbehaves: its channel broke: .*fds.*: "
               r"replacing it", timeout=20)
    m.wait_log(r"worker \d+\.\d+: ready", count=3, timeout=30)
    wait_for(lambda: gone(victim), 30, "the offender drained or killed, and reaped")
    with Client(tmp_path) as c:
        c.request("status")
        got = c.replies(1, 10)
        assert got and got[0]["ok"] and got[0]["result"]["pid"] == pid, got
    assert len(os.listdir(f"/proc/{pid}/fd")) < before + 8
    assert victim not in children(pid) and len(children(pid)) == 2
    assert m.proc.poll() is None and "Traceback" not in m.text(), m.text()
