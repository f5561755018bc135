"""The blocking WSGI app of bench/blocking_app.py (issue 21).

/         sleeps BLOCKING_APP_SLEEP_MS (default 5) ms, the database call's
          stand-in (time.sleep releases the GIL, as a driver waiting on its
          socket does), then answers "ok\\n"
/slow     sleeps 1 s (or /slow?S: S seconds): the slow endpoint of the
          head-of-line scenario
/fast     answers at once "tid=T slow=N pid=P": the answering thread's id, how
          many /slow requests this process was inside when it answered, and its
          pid (the head-of-line client checks the slow requests were in flight)

With BLOCKING_APP_STATS_DIR set, every process also times its 5 ms sleeps and
keeps "seconds count" (their sum and number so far) in DIR/PID, rewritten
every 64 sleeps: how long the kernel really let a request sleep, which bounds
any server's req/s at threads / (mean sleep).

The same module for every server (sockherd, gunicorn gthread, granian), so the
figures differ by the server alone.
"""
import os
import threading
import time

SLEEP = float(os.environ.get("BLOCKING_APP_SLEEP_MS", "5")) / 1000.0
BODY = b"ok\n"
_slow_lock = threading.Lock()
_slow_inside = 0
_STATS_DIR = os.environ.get("BLOCKING_APP_STATS_DIR")
_slept = [0.0, 0]              # seconds really slept, sleeps (under _slow_lock)


def _answer(start_response, body: bytes):
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]


def _slow(seconds: float) -> None:
    global _slow_inside
    with _slow_lock:
        _slow_inside += 1
    try:
        time.sleep(seconds)
    finally:
        with _slow_lock:
            _slow_inside -= 1


def app(environ, start_response):
    path = environ.get("PATH_INFO", "/")
    if path == "/fast":
        body = (f"tid={threading.get_ident()} slow={_slow_inside} "
                f"pid={os.getpid()}").encode()
        return _answer(start_response, body)
    if path == "/slow":
        _slow(float(environ.get("QUERY_STRING") or 1.0))
        return _answer(start_response, BODY)
    if _STATS_DIR:
        _timed_sleep()
    else:
        time.sleep(SLEEP)
    return _answer(start_response, BODY)


def _timed_sleep() -> None:
    t = time.perf_counter()
    time.sleep(SLEEP)
    took = time.perf_counter() - t
    with _slow_lock:
        _slept[0] += took
        _slept[1] += 1
        if _slept[1] % 64:
            return
        path = os.path.join(_STATS_DIR, str(os.getpid()))
        with open(path + ".tmp", "w") as f:
            f.write(f"{_slept[0]!r} {_slept[1]}")
        os.replace(path + ".tmp", path)
