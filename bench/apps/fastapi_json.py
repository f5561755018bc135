"""The FastAPI JSON endpoint of bench/asgi_hello.py (issue 22 §5): GET /
answers {"message":"Hello, world!"} through FastAPI's routing, its
dependency resolution and its JSON response, as a typical endpoint does."""
from fastapi import FastAPI

app = FastAPI()


@app.get("/")
async def root():
    return {"message": "Hello, world!"}


def _eager(inner):
    """inner with asyncio.eager_task_factory (Python 3.12+) set on the loop at the
    first request (issue 34: what 3.13 gives that 3.11 lacks, measured by
    bench/http_callgrind.py --app fastapi-eager; the warm-up covers the first).
    A task factory sends the engine's create_task through asyncio's own
    (worker/aio_native/tasks.c), so the figure is that path plus eager start."""
    import asyncio

    async def wrapped(scope, receive, send):
        loop = asyncio.get_running_loop()
        if loop.get_task_factory() is None:
            loop.set_task_factory(asyncio.eager_task_factory)
        await inner(scope, receive, send)
    return wrapped


eager_app = _eager(app)
