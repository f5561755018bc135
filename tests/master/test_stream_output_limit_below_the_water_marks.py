"""A stream_output_limit below the 1 MiB high-water mark still leaves a
handler that honours pause_writing room to do so (issue 20's review). The
setting may go down to 64 KiB, but pause_writing came only past 1 MiB: with
`--stream-output-limit 262144` a handler that stops writing at
pause_writing was closed for the limit ("past stream_output_limit") before
it was ever told, its output dropped. The marks are now under the limit
(high at most half of it). A real master and worker; the client reads
nothing until the buffers are full, then everything."""
from __future__ import annotations

import pytest

from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)

TOTAL = 8 << 20
LIMIT = 256 << 10

APPS = f"""
class Polite:
    '''Sends {TOTAL} bytes in 16 KiB pieces, only while writing is not paused.'''
    def on_connect(self, conn):
        self.sent = 0
        self.paused_at = []
        self.pump(conn)
    def pump(self, conn):
        while self.sent < {TOTAL} and not conn.writing_paused and not conn.closed:
            conn.write(b"p" * 16384)
            self.sent += 16384
        if self.sent >= {TOTAL}:
            conn.close()
    def pause_writing(self, conn):
        self.paused_at.append(conn.pending)
        if len(self.paused_at) == 1:
            print("first pause_writing at", conn.pending, flush=True)
    def resume_writing(self, conn):
        self.pump(conn)
    def on_data(self, conn, data):
        pass
"""


def test_a_handler_under_flow_control_is_not_cut_by_a_small_output_limit(master, tmp_path):
    (tmp_path / "protos.py").write_text(APPS)
    m = master("protos:Polite", "--interface", "stream", "-w", "1",
               "--stream-output-limit", str(LIMIT), ready=1)
    pid = children(m.proc.pid)[0]
    with m.connect() as c:
        c.settimeout(30)
        # paused (the kernel's buffers full, then the app's up to its mark)
        # before the client reads a byte
        pending = int(m.wait_log(r"first pause_writing at (\d+)")[0])
        assert pending <= LIMIT
        got = 0
        while chunk := c.recv(1 << 20):
            got += len(chunk)
    assert got == TOTAL, m.text()
    assert "stream_output_limit" not in m.text()
    assert children(m.proc.pid) == [pid]
