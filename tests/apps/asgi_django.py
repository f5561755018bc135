"""Django served through its ASGI handler with async views (issue 22 §4):
tests/asgi/test_asgi_django.py.

  GET /hello/<name>?q=  an async view that really suspends (asyncio.sleep)
                        before answering JSON
  GET /stream           an async StreamingHttpResponse (an async iterator)
  GET /boom             an async view that raises: 500
"""
import asyncio
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "asgi_django_settings")

from django.core.asgi import get_asgi_application  # noqa: E402
from django.http import JsonResponse, StreamingHttpResponse  # noqa: E402
from django.urls import path  # noqa: E402


async def hello(request, name):
    await asyncio.sleep(0.01)
    return JsonResponse({"name": name, "q": request.GET.get("q", ""),
                         "method": request.method, "async": True})


async def stream(request):
    async def parts():
        for i in range(3):
            await asyncio.sleep(0)
            yield f"part {i};"
    return StreamingHttpResponse(parts(), content_type="text/plain")


async def boom(request):
    raise RuntimeError("django async boom")


urlpatterns = [path("hello/<str:name>", hello), path("stream", stream), path("boom", boom)]

application = get_asgi_application()
