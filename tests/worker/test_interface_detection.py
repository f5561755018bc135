"""Which interface an app is served with (issue 22 §2, worker/interface.py):
`interface = auto` finds ASGI 3, WSGI or stream from the app object, an
explicit `--interface` the app contradicts is refused with what was found,
ASGI 2 apps are wrapped. Pure decisions on real objects first, then the
same through `sockherd check` (real frameworks: Starlette, FastAPI, Django,
Flask) and through a real master and worker (the start log line, and a
contradiction that stops the first start with the reason)."""
from __future__ import annotations

import asyncio
import functools
import inspect
import os
import subprocess
import sys

import pytest

from sockherd.worker.interface import InterfaceError, choose

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "master"))
from test_run import master  # noqa: E402,F401 - master: the fixture

pytestmark = pytest.mark.timeout(120)


async def asgi3(scope, receive, send):
    pass


def wsgi(environ, start_response):
    return [b""]


class Stream:
    def on_data(self, conn, data):
        conn.write(data)


class Asgi2:
    """An ASGI 2 ("double callable") app: made from the scope."""
    def __init__(self, scope):
        self.scope = scope

    async def __call__(self, receive, send):
        await send({"type": "seen", "scope": self.scope})


def asgi2_function(scope):
    async def instance(receive, send):
        await send({"type": "seen", "scope": scope})
    return instance


class AsgiObject:
    async def __call__(self, scope, receive, send):
        pass


class AwaitableAsgi:
    """ASGI 3 as a class: made from (scope, receive, send), then awaited."""
    def __init__(self, scope, receive, send):
        pass

    def __await__(self):
        return iter(())


def sync_three(scope, receive, send):
    return asgi3(scope, receive, send)


@functools.wraps(asgi3)
def wrapped_asgi3(*args):
    return asgi3(*args)


def marked():
    """A sync function marked as a coroutine function: Django's way
    (asgiref's markcoroutinefunction on 3.11, inspect's from 3.12)."""
    from asgiref.sync import markcoroutinefunction

    def app(scope, receive, send):
        return asgi3(scope, receive, send)
    return markcoroutinefunction(app)


@pytest.mark.parametrize("app, kind, why", [
    (asgi3, "asgi", "a coroutine function"),
    (functools.partial(asgi3), "asgi", "a functools.partial of a coroutine function"),
    (marked(), "asgi", "a coroutine function"),
    (AsgiObject(), "asgi", "an object (AsgiObject) whose __call__ is a coroutine function"),
    (AwaitableAsgi, "asgi", "a class of awaitable instances"),
    (wrapped_asgi3, "asgi", "a wrapper of a coroutine function"),
    (wsgi, "wsgi", "a plain callable of two arguments"),
    (Stream, "stream", "a handler class with on_data"),
])
def test_auto_finds_the_interface(app, kind, why):
    chosen = choose(app)
    assert (chosen.kind, chosen.why) == (kind, why)
    assert chosen.app is app
    assert str(chosen) == f"{kind} ({why})"


@pytest.mark.skipif(not hasattr(inspect, "markcoroutinefunction"), reason="Python 3.12+")
def test_inspect_markcoroutinefunction_is_asgi():
    def app(scope, receive, send):
        return asgi3(scope, receive, send)
    assert choose(inspect.markcoroutinefunction(app)).kind == "asgi"


@pytest.mark.parametrize("app, why", [
    (Asgi2, "an ASGI 2 class"),
    (asgi2_function, "a callable of one argument"),
])
def test_asgi2_is_wrapped_into_asgi3(app, why):
    chosen = choose(app)
    assert chosen.kind == "asgi" and chosen.why.startswith(why)
    assert chosen.why.endswith("wrapped as ASGI 3")
    assert inspect.iscoroutinefunction(chosen.app)
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {}

    asyncio.run(chosen.app({"type": "http", "path": "/x"}, receive, send))
    assert sent == [{"type": "seen", "scope": {"type": "http", "path": "/x"}}]


def test_a_sync_callable_of_three_arguments_is_refused_under_auto():
    with pytest.raises(InterfaceError, match=r"app 'm:a' is a callable of three arguments that "
                                             r"is not a coroutine function: .*--interface asgi"):
        choose(sync_three, "auto", "app 'm:a'")
    chosen = choose(sync_three, "asgi")          # its author says: it returns an awaitable
    assert chosen.kind == "asgi" and chosen.app is sync_three


@pytest.mark.parametrize("app, interface, message", [
    (asgi3, "wsgi", "--interface wsgi, but app 'm:a' is a coroutine function: that is the asgi "
                    "interface (set --interface asgi, or auto)"),
    (AsgiObject(), "stream", "--interface stream, but app 'm:a' is an object (AsgiObject) whose "
                             "__call__ is a coroutine function: that is the asgi interface"),
    (wsgi, "asgi", "--interface asgi, but app 'm:a' is a plain callable of two arguments: that "
                   "is the wsgi interface"),
    (Stream, "wsgi", "--interface wsgi, but app 'm:a' is a handler class with on_data: that is "
                     "the stream interface"),
    (Asgi2, "wsgi", "--interface wsgi, but app 'm:a' is an ASGI 2 class"),
    (wsgi, "stream", "--interface stream, but app 'm:a' is a plain callable of two arguments: "
                     "that is the wsgi interface"),
])
def test_an_explicit_interface_the_app_contradicts_is_refused(app, interface, message):
    with pytest.raises(InterfaceError) as info:
        choose(app, interface, "app 'm:a'")
    assert str(info.value).startswith(message), str(info.value)


def test_an_explicit_interface_that_agrees_is_taken():
    assert choose(asgi3, "asgi").app is asgi3
    assert choose(wsgi, "wsgi").app is wsgi
    assert choose(Stream, "stream").app is Stream
    wrapped = choose(Asgi2, "asgi")
    assert wrapped.app is not Asgi2 and wrapped.why.endswith("wrapped as ASGI 3 (--interface)")


# ---- through `sockherd check`, on real frameworks -------------------------------------------
APPS = {
    "plain.py": """
async def asgi(scope, receive, send): pass
def wsgi(environ, start_response):
    start_response("200 OK", [("Content-Length", "1")])
    return [b"w"]
class Echo:
    def on_data(self, conn, data): conn.write(data)
""",
    "star.py": """
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
async def hello(request): return PlainTextResponse("hi")
app = Starlette(routes=[Route("/", hello)])
""",
    "fast.py": """
from fastapi import FastAPI
app = FastAPI()
@app.get("/")
async def root(): return {"hi": 1}
""",
    "flaskapp.py": """
from flask import Flask
app = Flask(__name__)
""",
    "djangoapp.py": """
import django
from django.conf import settings
settings.configure(DEBUG=False, ROOT_URLCONF=__name__, ALLOWED_HOSTS=["*"], SECRET_KEY="x")
django.setup()
urlpatterns = []
from django.core.asgi import get_asgi_application
from django.core.wsgi import get_wsgi_application
asgi = get_asgi_application()
wsgi = get_wsgi_application()
""",
    "partialapp.py": """
import functools
async def base(scope, receive, send, greeting="hi"): pass
app = functools.partial(base, greeting="hello")
""",
}


@pytest.fixture
def appdir(tmp_path):
    for name, text in APPS.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def check(appdir, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOCKHERD_")}
    return subprocess.run([sys.executable, "-m", "sockherd.master", "check", *args,
                           "--chdir", str(appdir)], cwd=appdir, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("spec, line", [
    ("plain:asgi", "interface: asgi (a coroutine function)"),
    ("plain:wsgi", "interface: wsgi (a plain callable of two arguments)"),
    ("plain:Echo", "interface: stream (a handler class with on_data)"),
    ("star:app", "interface: asgi (an object (Starlette) whose __call__ is a coroutine function)"),
    ("fast:app", "interface: asgi (an object (FastAPI) whose __call__ is a coroutine function)"),
    ("flaskapp:app", "interface: wsgi (a plain callable of two arguments)"),
    ("djangoapp:asgi",
     "interface: asgi (an object (ASGIHandler) whose __call__ is a coroutine function)"),
    ("djangoapp:wsgi", "interface: wsgi (a plain callable of two arguments)"),
    ("partialapp:app", "interface: asgi (a functools.partial of a coroutine function)"),
])
def test_check_reports_the_interface(appdir, spec, line):
    r = check(appdir, spec)
    assert r.returncode == 0, r.stderr
    assert f"sockherd check: {line}\n" in r.stdout, r.stdout


def test_check_refuses_a_contradiction(appdir):
    r = check(appdir, "star:app", "--interface", "wsgi")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "sockherd: --interface wsgi, but app 'star:app' is an object (Starlette) whose " \
           "__call__ is a coroutine function: that is the asgi interface" in r.stderr
    assert r.stdout == ""


# ---- on a real master and worker -------------------------------------------------------------
def test_the_worker_logs_its_choice_at_start(master, tmp_path):
    (tmp_path / "plain.py").write_text(APPS["plain.py"])
    m = master("plain:wsgi", "-w", "1", ready=1)
    m.wait_log(r"\[worker \d+\] INFO interface: wsgi \(a plain callable of two arguments\)")
    with m.connect() as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.recv(100).startswith(b"HTTP/1.1 200 ")


def test_a_contradicted_interface_stops_the_first_start_saying_what_was_found(master, tmp_path):
    (tmp_path / "plain.py").write_text(APPS["plain.py"])
    m = master("plain:asgi", "--interface", "wsgi", "-w", "2", ready=None)
    assert m.proc.wait(timeout=60) == 1
    text = m.text()
    assert "failed before ready: --interface wsgi, but app 'plain:asgi' is a coroutine " \
           "function: that is the asgi interface (set --interface asgi, or auto)" in text, text
    assert "no worker became ready" in text


def test_a_wsgi_worker_does_not_pay_for_asyncio(appdir):
    """Found by test_upgrade_comeback.py: importing asyncio for detection
    and lifespan in every worker made WSGI workers start later (~40 ms idle,
    more under load). Only an ASGI worker imports it."""
    code = ("import sys; from sockherd.worker import bootstrap, interface\n"
            "import plain\n"
            "assert interface.choose(plain.wsgi).kind == 'wsgi'\n"
            "assert interface.choose(plain.Echo).kind == 'stream'\n"
            "print('asyncio' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=appdir, capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": str(appdir)})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "False\n"
