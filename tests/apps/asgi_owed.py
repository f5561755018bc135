"""ASGI app for the owed-answers review (tests/asgi/test_owed_answers.py):
/fast answers at once (its query string
echoed, "ok" without one); /block?ms=N blocks its loop thread N ms before
answering, /after?ms=N blocks it N ms after its answer is whole (work
after the response in the same task, as a Starlette BackgroundTask's):
time.sleep in an async view, an app bug but a common one (a sync driver)."""
import time



async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    path = scope["path"]
    query = scope["query_string"]
    ms = int(query.split(b"=", 1)[1]) if path != "/fast" else 0
    if path == "/block":
        time.sleep(ms / 1000)                  # the whole loop thread waits
    body = query if path == "/fast" and query else b"ok"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
    if path == "/after":
        time.sleep(ms / 1000)
