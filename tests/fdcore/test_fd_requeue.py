"""fdc_requeue: a thread that accepted moves its own registration of an
exclusive listener to the end of the listener's wait queue, so the kernel
offers the next connection to the poller that waited longest, and nobody
else is woken or updated (the verb pair stop_recv/want_recv would make every
thread of the group DEL and ADD it, waking them all)."""
import errno
import socket
import threading
import time

import pytest

from sockherd.fdcore import Table

pytestmark = pytest.mark.timeout(60)


EPOLL_WAIT = {"232", "281"}          # x86_64 epoll_wait, epoll_pwait


def in_epoll_wait(tids: list[int]) -> bool:
    """The kernel's view: every thread of tids sleeps in epoll_wait
    (/proc/.../syscall names the syscall a blocked thread is in)."""
    for tid in tids:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            if f.read().split()[0] not in EPOLL_WAIT:
                return False
    return True


def serve(table: Table, lfd: int, addr, rounds: int, requeue: bool) -> list[int]:
    """Both threads of the group wait in poll(); each connection, made once
    both sleep in epoll_wait, is accepted by whichever thread the kernel
    wakes, which requeues (or not) and waits again. Returns the tid of the
    thread that accepted each connection."""
    order: list[int] = []
    native: list[int] = []
    stop = threading.Event()
    got = threading.Semaphore(0)

    def run(th):
        native.append(threading.get_native_id())
        while not stop.is_set():
            for ev in th.poll(100):
                if ev.fd != lfd:
                    continue
                for fd in th.accept(lfd, 1):
                    if requeue:
                        assert th.requeue(lfd)
                    socket.socket(fileno=fd).close()
                    order.append(th.tid)
                    got.release()
            th.leave_all()

    workers = [threading.Thread(target=run, args=(th,)) for th in table.threads]
    for w in workers:
        w.start()
    try:
        for _ in range(rounds):
            deadline = time.monotonic() + 10
            while not (len(native) == 2 and in_epoll_wait(native)):
                assert time.monotonic() < deadline, "pollers never both idle"
                time.sleep(0.001)
            socket.create_connection(addr).close()
            assert got.acquire(timeout=10)
    finally:
        stop.set()
        for w in workers:
            w.join(10)
    return order


@pytest.fixture
def shared_listener():
    srv = socket.create_server(("127.0.0.1", 0), backlog=64)
    srv.setblocking(False)
    addr = srv.getsockname()
    table = Table(2, 1)
    lfd = table.insert_listener(srv.detach(), 1, {1: 0b11}, exclusive=True)[1]
    table.threads[0].want_recv(lfd)
    yield table, lfd, addr
    table.close()


def test_requeue_rotates_connections_over_idle_pollers(shared_listener):
    table, lfd, addr = shared_listener

    def totals():
        return [sum(th.counters()[k] for th in table.threads)
                for k in ("accept_empty", "wakeups", "loops")]

    serve(table, lfd, addr, 1, requeue=True)   # set-up: both threads register it
    before = totals()
    order = serve(table, lfd, addr, 10, requeue=True)
    after = totals()
    assert order[0] != order[1] and order == order[:2] * 5, order
    # nobody was woken for nothing: a requeue touches only its own epoll
    assert after[0] == before[0] and after[1] == before[1], (before, after)


def test_without_requeue_the_first_registered_poller_takes_all(shared_listener):
    """The kernel fact requeue exists for."""
    table, lfd, addr = shared_listener
    order = serve(table, lfd, addr, 10, requeue=False)
    assert len(set(order)) == 1, order


def test_requeue_refuses_what_it_cannot_move():
    with Table(1, 1) as table:
        th = table.threads[0]
        srv = socket.create_server(("127.0.0.1", 0))
        srv.setblocking(False)
        plain = table.insert_listener(srv.detach(), 1, {1: 0b1}, exclusive=False)[1]
        th.want_recv(plain)
        th.update_pass()
        with pytest.raises(OSError) as exc:
            th.requeue(plain)                  # th does not hold it
        assert exc.value.errno == errno.EPERM
        th.enter(plain)
        assert th.requeue(plain) is False      # not exclusive: nothing to move
        with pytest.raises(OSError) as exc:
            th.requeue(10 ** 6)
        assert exc.value.errno == errno.EBADF
