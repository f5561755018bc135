"""Process titles as the README gives them: `sockherd: master [app]` and
`sockherd: worker GEN.IDX [app]`, for a real master and its workers."""
from __future__ import annotations

import pytest

from test_run import children, master, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(60)


def _title(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().rstrip(b"\0")


def test_embedded_page_workers_name_what_they_serve(master):
    """Defect: without an app (the embedded status page) the worker's title
    was `sockherd: worker 1.0 []` while the master's says [embedded]."""
    m = master("-w", "1", ready=1)
    worker = wait_for(lambda: children(m.proc.pid), 10, "the worker")[0]
    assert _title(m.proc.pid).startswith(b"sockherd: master [embedded]")
    assert _title(worker).startswith(b"sockherd: worker 1.0 [embedded]"), _title(worker)
