"""The master's fd budget (master/fdbudget.py, issue 19 finding 3) without
a master: the floors for a limit, and the estimate of free fds against a
real fd table (this process's, its soft limit lowered for the test)."""
from __future__ import annotations

import os
import resource

import pytest

from sockherd.master.fdbudget import RESERVE, Budget, Floors

pytestmark = pytest.mark.timeout(30)


def test_floors_keep_their_order_and_scale_with_the_table():
    for limit in (64, 1024, 65536, 1 << 20):
        f = Floors.of(limit)
        # control below the point it comes back at, which is where metrics
        # stop; the hand-off stops first, a whole fd batch higher
        assert RESERVE < f.control < f.control_again == f.metrics < f.handoff
        assert f.control >= limit // 16
    assert Floors.of(64).control == RESERVE + 8


@pytest.fixture
def low_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    opened = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (opened + 100, hard))
    yield opened + 100
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_estimate_counts_what_is_taken_and_given_and_a_stale_count_is_redone(low_limit):
    budget = Budget()
    assert budget.free_at_least(90) and not budget.free_at_least(110)
    budget.taken(50)                      # as if 50 accepts went in
    assert not budget.free_at_least(90) and budget.free_at_least(40)
    budget.given(50)
    assert budget.free_at_least(90)
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(60)]
    try:
        assert budget.free_at_least(90)   # unseen until the next count
        budget.stale()
        assert not budget.free_at_least(90) and budget.free_at_least(30)
    finally:
        for fd in fds:
            os.close(fd)


def test_the_spare_fds_are_let_go_and_taken_back(low_limit):
    budget = Budget()
    budget.hold_spare()
    before = len(os.listdir("/proc/self/fd"))
    with budget.spare_released():
        assert len(os.listdir("/proc/self/fd")) == before - 4
    assert len(os.listdir("/proc/self/fd")) == before
    with budget.spare_released():
        pass
    for fd in budget._spare:
        os.close(fd)
