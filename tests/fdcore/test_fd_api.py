"""The cffi surface matches fd.h, and C errors surface as precise OSErrors."""
import errno
import re
from pathlib import Path

import pytest

from sockherd.fdcore import Table, check
from sockherd.fdcore._fdcore import lib

pytestmark = pytest.mark.timeout(60)

FD_H = Path(__file__).resolve().parents[2] / "fdcore" / "fd.h"


def declared_functions() -> set[str]:
    text = re.sub(r"/\*.*?\*/", "", FD_H.read_text(), flags=re.S)
    return set(re.findall(r"\b(fdc_[a-z_]+)\s*\(", text)) - {"fdc_hook_fn"}


def test_every_function_of_fd_h_is_callable_from_python():
    names = declared_functions()
    assert len(names) > 20
    missing = sorted(n for n in names if not hasattr(lib, n))
    assert not missing, f"declared in fd.h but missing from the cdef in _build.py: {missing}"


def test_check_turns_negative_errno_into_oserror():
    assert check(3, "x") == 3
    with pytest.raises(OSError) as exc:
        check(-errno.EBADF, "delete fd 7")
    assert exc.value.errno == errno.EBADF
    assert str(exc.value).endswith("delete fd 7: Bad file descriptor")


@pytest.mark.parametrize(
    "threads, groups",
    [(0, 1), (2, 0), (2, 3), (65, 1), (1, 33)],
)
def test_bad_thread_layouts_are_refused(threads, groups):
    with pytest.raises(OSError) as exc:
        Table(threads=threads, groups=groups, maxfd=64)
    assert exc.value.errno == errno.EINVAL
    assert f"{threads} threads, {groups} groups" in str(exc.value)


def test_groups_split_threads_first_groups_take_the_remainder():
    with Table(threads=5, groups=2, maxfd=64) as t:
        assert [(th.tid, th.tgid, th.ltid) for th in t.threads] == [
            (0, 1, 0), (1, 1, 1), (2, 1, 2), (3, 2, 0), (4, 2, 1),
        ]
        assert t.group_base(2) == 3


def test_64_threads_fit_one_group():
    with Table(threads=64, groups=1, maxfd=64) as t:
        assert t.threads[63].bit == 1 << 63


def test_closed_table_refuses_use():
    t = Table(threads=1, maxfd=64)
    t.close()
    t.close()  # idempotent
    with pytest.raises(ValueError, match="fd table is closed"):
        t.dump(0)


def test_leave_all_releases_the_last_batch_and_skips_events_left_already():
    import socket

    with Table(threads=2, maxfd=1024) as t:
        th, other = t.threads
        peers = []
        for owner in (1, 2, 3, 4):
            a, b = socket.socketpair()
            peers.append(b)
            fd = a.detach()
            t.insert(fd, owner, thread_mask=0b11 if owner == 4 else 0b01)
            th.want_recv(fd)
            b.send(b"x")
        evs = sorted(th.poll(1000), key=lambda e: e.owner)
        assert [e.owner for e in evs] == [1, 2, 3, 4]
        assert all(t.dump(e.fd).running_mask == th.bit for e in evs)
        th.leave(evs[0].fd, evs[0].gen)      # left by hand already
        assert th.delete(evs[1].fd) is True  # the handler deleted its own fd: closed now
        assert other.delete(evs[3].fd) is False  # deleted elsewhere while we hold it
        assert t.dump(evs[3].fd).tgid == 1
        # the deferred close happens here; the two not held any more count
        # as CLOSED too, the one still held and open does not
        assert th.leave_all() == 3
        assert t.dump(evs[3].fd).tgid == 0 and t.dump(evs[3].fd).generation == evs[3].gen + 1
        assert all(t.dump(e.fd).running_mask == 0 for e in (evs[0], evs[2]))
        assert th.leave_all() == 0           # nothing held any more
        for e in (evs[0], evs[2]):
            th.delete(e.fd)
        for b in peers:
            b.close()
