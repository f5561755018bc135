"""A worker goes on accepting after the kernel refused its listener's
re-registration (fdstress review of fdcore's fdc_requeue and its retry
ring, 2026-11-26).

After each accept batch the loop thread moves its exclusive registration
of the listener to the end of the wait queue (fdc_requeue: EPOLL_CTL_DEL
then EPOLL_CTL_ADD on its epoll). The ADD can fail after the DEL did:
ENOSPC once the user's max_user_watches is reached (a connection flood
under dispatch costs a watch per connection and loop thread), ENOMEM.
fdcore cleared the thread's polled bit and reported FDC_POLL_CTL (I8), but
the loop, the listener's owner, has nothing to close and only logs the
failure: the thread never polled the listener again, and a worker of one
loop thread accepted nothing more, alive and answering its master, until
restarted. Fixed in fdcore: a listener's refused registration is made again
by its thread's later update passes (FDC_RETRY_ADD, poller_owed.c fail_fd).

The refusal is real to the worker: a preloaded shim (built here with gcc)
wraps epoll_ctl and answers ENOSPC to the first ADD of a listening TCP
socket that follows its DEL from the same epoll instance (a requeue),
without calling the kernel; nothing else changes.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest

from test_run import master  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(240)

APP = """\
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]
"""

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>

/* The first SHIM_FAIL_REQUEUES ADDs of a listening TCP socket that follow
 * its DEL from the same epoll instance, on the same thread, fail with
 * ENOSPC (as at max_user_watches) without reaching the kernel. */
static int (*real)(int, int, int, struct epoll_event *);
static __thread int del_epfd = -1, del_fd = -1;
static int left = -1;

static int tcp_listener(int fd)
{
	int on = 0, dom = 0;
	socklen_t l1 = sizeof(on), l2 = sizeof(dom);

	return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &l1) == 0 && on &&
	       getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l2) == 0 &&
	       (dom == AF_INET || dom == AF_INET6);
}

int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	int requeue = op == EPOLL_CTL_ADD && epfd == del_epfd && fd == del_fd;

	if (!real)
		real = (int (*)(int, int, int, struct epoll_event *))dlsym(RTLD_NEXT, "epoll_ctl");
	if (left < 0) {
		const char *s = getenv("SHIM_FAIL_REQUEUES");
		left = s ? atoi(s) : 0;
	}
	del_epfd = op == EPOLL_CTL_DEL ? epfd : -1;
	del_fd = op == EPOLL_CTL_DEL ? fd : -1;
	if (requeue && left > 0 && tcp_listener(fd)) {
		left--;
		errno = ENOSPC;
		return -1;
	}
	return real(epfd, op, fd, ev);
}
"""


def get(port: int, within: float) -> bytes:
    """One request on a new connection; what came back within the deadline
    (b"" if nothing did)."""
    with socket.create_connection(("127.0.0.1", port), timeout=within) as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        out = b""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            c.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = c.recv(4096)
            except TimeoutError:
                break
            if not chunk:
                break
            out += chunk
        return out


@pytest.fixture
def shim(tmp_path, monkeypatch):
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc not found: this test builds its epoll_ctl shim")
    src = tmp_path / "shim.c"
    src.write_text(SHIM)
    so = tmp_path / "shim.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", str(src), "-o", str(so), "-ldl"],
                   check=True, capture_output=True, timeout=120)
    monkeypatch.setenv("LD_PRELOAD", str(so))
    monkeypatch.setenv("SHIM_FAIL_REQUEUES", "1")
    return so


def test_a_worker_of_one_thread_accepts_after_its_requeue_was_refused(master, tmp_path, shim):
    """`-w 1 --threads 1`: the first connection is served, and its accept's
    requeue refused (the loop logs it); the next connection must still be
    accepted and answered (before the fix it waited in the backlog for
    ever: nothing polled the listener any more)."""
    (tmp_path / "okapp.py").write_text(APP)
    m = master("okapp:app", "-w", "1", "--threads", "1", ready=1)
    assert get(m.port, 10).startswith(b"HTTP/1.1 200 OK")
    m.wait_log(r"re-registration failed: .*No space left on device", timeout=10)
    for i in range(3):
        out = get(m.port, 5)
        assert out.startswith(b"HTTP/1.1 200 OK"), (
            f"connection {i + 2} after the refused requeue: {out!r} within 5 s\n{m.text()}")
