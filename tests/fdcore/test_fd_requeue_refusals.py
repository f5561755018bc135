"""Adversarial review of fdc_requeue (fdcore/poller_accept.c). Each test (its comment
starts "Was:") failed before the fix and passes since."""
import errno
import socket

import pytest

from sockherd.fdcore import Table
from fd_harness import epoll_regs

pytestmark = pytest.mark.timeout(60)

OWNER = 0x5EED


def _regs(th, fd):
    return [r for r in epoll_regs(th.epfd) if r[0] == fd]


# Was: fdc_requeue checks running_mask & ltid_bit without checking the fd's tgid: a thread
# of group 1 calling it on group 2's fd, held by group 2's thread with the same local bit,
# passes the 'holds fd' check, DELs from its own epoll (ENOENT), then clears the OTHER
# thread's polled bits and marks the fd FDC_ERR|FDC_POLL_CTL; group 2's kernel
# registration is left unknown to polled_mask (so the CLONED final close will not DEL it).
# Expected -EPERM. (fixed; this test failed before).
def test_requeue_of_another_groups_fd_is_refused_and_changes_nothing():
    with Table(2, 2) as table:
        th1, th2 = table.threads           # group 1 ltid 0, group 2 ltid 0
        assert th1.tgid != th2.tgid
        srv = socket.create_server(("127.0.0.1", 0))
        srv.setblocking(False)
        fds = table.insert_listener(srv.detach(), OWNER, {th2.tgid: 0b1}, exclusive=True)
        fd = fds[th2.tgid]
        th2.want_recv(fd)
        th2.update_pass()
        assert _regs(th2, fd)
        th2.enter(fd)                       # group 2's thread holds fd
        before = table.dump(fd)
        assert before.polled_recv == 1
        try:
            with pytest.raises(OSError) as exc:
                th1.requeue(fd)             # th1 does not hold it
            assert exc.value.errno == errno.EPERM
        finally:
            after = table.dump(fd)
            # whatever happened, the state must still match the kernel
            assert _regs(th2, fd) and after.polled_recv == 1, after
            assert int(after.state) == int(before.state), (before, after)


# Was: a DEL refused with ENOENT (file gone from the number) makes fdc_requeue return
# -ENOENT, the same code as 'nothing to move'; Thread.requeue maps it to False although
# polled bits were cleared and a FDC_POLL_CTL failure was queued: the caller cannot tell a
# failed re-registration (docstring: raises OSError) from a no-op (fixed; this test failed
# before).
def test_requeue_failed_del_is_not_reported_as_nothing_to_move():
    import os
    with Table(1, 1) as table:
        th = table.threads[0]
        srv = socket.create_server(("127.0.0.1", 0))
        srv.setblocking(False)
        fd = table.insert_listener(srv.detach(), OWNER, {th.tgid: 0b1}, exclusive=True)[th.tgid]
        th.want_recv(fd)
        th.update_pass()
        keep = os.dup(fd)                   # old file lives on, number swapped
        a, b = socket.socketpair()
        os.dup2(a.fileno(), fd)
        a.close()
        try:
            th.enter(fd)
            with pytest.raises(OSError) as exc:
                th.requeue(fd)
            assert exc.value.errno == errno.ENOENT
        finally:
            info = table.dump(fd)
            th.leave_all()
            os.close(keep)
            b.close()
        assert info.polled_recv == 0 and info.ctl_errno == errno.ENOENT
