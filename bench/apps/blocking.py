"""The blocking WSGI app of bench/blocking_app.py (issue 21).

/         sleeps BLOCKING_APP_SLEEP_MS (default 5) ms, the database call's
          stand-in (time.sleep releases the GIL, as a driver waiting on its
          socket does), then answers "ok\\n"
/slow     sleeps 1 s (or /slow?S: S seconds): the slow endpoint of the
          head-of-line scenario
/fast     answers at once "tid=T slow=N pid=P": the answering thread's id, how
          many /slow requests this process was inside when it answered, and its
          pid (the head-of-line client checks the slow requests were in flight)

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
    time.sleep(SLEEP)
    return _answer(start_response, BODY)
