"""The one way the ipc tests wait for something another process or thread does: poll a
condition with a deadline, and fail loudly saying what never happened."""

import time


def wait_until(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)
