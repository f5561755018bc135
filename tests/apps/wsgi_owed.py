"""WSGI app for the owed-answers review (tests/worker/test_owed_answers_wsgi.py):
/fast answers at once; /sleep?ms=N&mark=PATH creates PATH, then sleeps
N ms (the test knows the loop thread is busy); POST /upload reads its
whole body and answers its length."""
import os
import time
from urllib.parse import parse_qs


def app(environ, start_response):
    path = environ["PATH_INFO"]
    q = parse_qs(environ.get("QUERY_STRING", ""))
    if path == "/sleep":
        with open(q["mark"][0], "w"):
            pass
        time.sleep(int(q["ms"][0]) / 1000)
        body = b"slept"
    elif path == "/upload":
        n = 0
        while True:
            chunk = environ["wsgi.input"].read(65536)
            if not chunk:
                break
            n += len(chunk)
        body = str(n).encode()
    else:
        body = b"ok"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
