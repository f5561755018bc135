"""The FastAPI JSON endpoint of bench/asgi_hello.py (issue 22 §5): GET /
answers {"message":"Hello, world!"} through FastAPI's routing, its
dependency resolution and its JSON response, as a typical endpoint does."""
from fastapi import FastAPI

app = FastAPI()


@app.get("/")
async def root():
    return {"message": "Hello, world!"}
