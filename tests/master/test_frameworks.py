"""Real Flask and Django apps served by `sockherd run` (real master, real
workers, the wsgi interface): routing, query strings, forms, a 50 MB
multipart upload read in a stream, cookies, streaming and file responses,
404 and 500."""
from __future__ import annotations

import http.client
import os
import re
import uuid

import pytest

from test_run import master, module_master  # noqa: F401  (the fixtures: real processes, reaped)

pytestmark = pytest.mark.timeout(180)

FLASK_APP = '''
import os, resource
from flask import Flask, request, make_response, send_file, Response, abort

app = Flask(__name__)

@app.route("/hello/<name>")
def hello(name):
    return f"hello {name} q={request.args.get('q', '')}"

@app.post("/form")
def form():
    return f"a={request.form['a']} b={request.form['b']}"

@app.post("/upload")
def upload():
    f = request.files["file"]
    total = 0
    while chunk := f.stream.read(1 << 20):
        total += len(chunk)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB
    return f"{f.filename} {total} {peak}"

@app.route("/cookie")
def cookie():
    seen = request.cookies.get("c", "none")
    r = make_response(f"seen {seen}")
    r.set_cookie("c", "v1")
    return r

@app.route("/stream")
def stream():
    return Response((f"part{i};" for i in range(5)), mimetype="text/plain")

@app.route("/file")
def file():
    return send_file(os.path.abspath(__file__), mimetype="text/plain")

@app.route("/boom")
def boom():
    raise RuntimeError("flask boom")
'''

DJANGO_APP = '''
from django.conf import settings
settings.configure(DEBUG=False, ALLOWED_HOSTS=["*"], ROOT_URLCONF=__name__, SECRET_KEY="x",
                   MIDDLEWARE=[], DATA_UPLOAD_MAX_MEMORY_SIZE=None,
                   FILE_UPLOAD_MAX_MEMORY_SIZE=1 << 20)
import django
django.setup()
from django.http import HttpResponse, StreamingHttpResponse
from django.urls import path
from django.core.wsgi import get_wsgi_application

def hello(request, name):
    return HttpResponse(f"hello {name} q={request.GET.get('q', '')}")

def form(request):
    return HttpResponse(f"a={request.POST['a']} n={len(request.FILES['file'].read())}")

def stream(request):
    return StreamingHttpResponse(f"chunk{i};" for i in range(3))

def boom(request):
    raise RuntimeError("django boom")

urlpatterns = [path("hello/<str:name>", hello), path("form", form), path("stream", stream),
               path("boom", boom)]
app = get_wsgi_application()
'''


def multipart(fields: dict[str, str], file_name: str, file_size: int):
    """A multipart/form-data body as an iterator of blocks, and its length."""
    boundary = uuid.uuid4().hex
    head = "".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
                   for k, v in fields.items())
    head += (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
             f'filename="{file_name}"\r\nContent-Type: application/octet-stream\r\n\r\n')
    tail = f"\r\n--{boundary}--\r\n".encode()
    length = len(head.encode()) + file_size + len(tail)

    def blocks():
        yield head.encode()
        left = file_size
        while left:
            n = min(left, 1 << 20)
            yield b"u" * n
            left -= n
        yield tail

    return blocks(), length, f"multipart/form-data; boundary={boundary}"


def get(m, path, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=60)
    conn.request("GET", path, headers=headers or {})
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r, body


@pytest.fixture(scope="module")
def flask_app(module_master, tmp_path_factory):
    """One Flask master for the module's Flask tests: they only send
    requests and check the answers (its start was most of each test)."""
    site = tmp_path_factory.mktemp("flask")
    (site / "flaskapp.py").write_text(FLASK_APP)
    return module_master("flaskapp:app", "-w", "2", chdir=site)


def test_flask_routes_query_form_cookies(flask_app):
    m = flask_app
    r, body = get(m, "/hello/world?q=1")
    assert r.status == 200 and body == b"hello world q=1"
    conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=30)
    conn.request("POST", "/form", body="a=1&b=two",
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert conn.getresponse().read() == b"a=1 b=two"
    conn.request("GET", "/cookie")
    r = conn.getresponse()
    assert r.read() == b"seen none" and "c=v1" in r.getheader("Set-Cookie")
    conn.request("GET", "/cookie", headers={"Cookie": "c=v1"})
    assert conn.getresponse().read() == b"seen v1"
    conn.close()


def test_flask_streaming_file_404_and_500(flask_app):
    m = flask_app
    r, body = get(m, "/stream")
    assert body == b"part0;part1;part2;part3;part4;" and r.getheader("Transfer-Encoding") == "chunked"
    r, body = get(m, "/file")
    assert r.status == 200 and b"from flask import Flask" in body
    assert r.getheader("Content-Length") == str(len(body))
    assert get(m, "/nope")[0].status == 404
    r, _ = get(m, "/boom")
    assert r.status == 500
    assert get(m, "/hello/again")[1] == b"hello again q="       # still serving


def test_flask_50mb_multipart_upload_is_streamed(flask_app):
    m = flask_app
    size = 50 << 20
    blocks, length, ctype = multipart({"x": "1"}, "big.bin", size)
    conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=120)
    conn.putrequest("POST", "/upload")
    conn.putheader("Content-Type", ctype)
    conn.putheader("Content-Length", str(length))
    conn.endheaders()
    for block in blocks:
        conn.send(block)
    r = conn.getresponse()
    name, total, peak_kib = r.read().decode().split()
    conn.close()
    assert r.status == 200 and name == "big.bin" and int(total) == size
    # werkzeug spools to a temporary file; the server never held the body
    assert int(peak_kib) < 45 * 1024, f"worker peak RSS {peak_kib} KiB for a 50 MB upload"


def test_django_routes_forms_upload_stream_404_500(master, tmp_path):
    (tmp_path / "djangoapp.py").write_text(DJANGO_APP)
    m = master("djangoapp:app", "-w", "1", ready=1)
    r, body = get(m, "/hello/dj?q=x")
    assert r.status == 200 and body == b"hello dj q=x"
    blocks, length, ctype = multipart({"a": "form value"}, "f.bin", 3 << 20)
    conn = http.client.HTTPConnection("127.0.0.1", m.port, timeout=60)
    conn.putrequest("POST", "/form")
    conn.putheader("Content-Type", ctype)
    conn.putheader("Content-Length", str(length))
    conn.endheaders()
    for block in blocks:
        conn.send(block)
    assert conn.getresponse().read() == b"a=form value n=%d" % (3 << 20)
    conn.close()
    r, body = get(m, "/stream")
    assert body == b"chunk0;chunk1;chunk2;"
    assert get(m, "/nope")[0].status == 404
    assert get(m, "/boom")[0].status == 500
    assert "django boom" in m.text() or re.search(r"Internal Server Error", m.text())
