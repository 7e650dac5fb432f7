"""The gateway's HTTP routes (FastAPI): bodies read as strict JSON, streaming, and a client that goes away.

A chat request's engine call races the client's connection: when the client disconnects first, the call is
cancelled (an HTTP engine drops the request; an in-process one's result is thrown away) and nothing is recorded;
a client that goes away after the engine answered but before the reply is sent gets its action discarded too
(``GatewaySession.complete``'s ``gone``). What is recorded is what was sent: a disconnect while the bytes of the
reply are already on their way is the one case not caught (the reply is whole before the first byte, so this is
the time to write a few kB to a local socket).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sao.agent.gateway.replies import error_body, stream_events
from sao.agent.gateway.wire import ChatRequest, RequestError, read_json

if TYPE_CHECKING:
    from sao.agent.gateway.server import Gateway


def _bearer(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else ""


async def _until_disconnect(request: Request) -> None:
    """Return when the client disconnects (the ASGI ``http.disconnect`` after the body was read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(
    work: Awaitable[tuple[int, dict[str, Any], ChatRequest | None]], watcher: asyncio.Task[None]
) -> tuple[int, dict[str, Any], ChatRequest | None]:
    """``work``'s result, or, when the client disconnects first, ``work`` cancelled and a 499 nobody reads."""
    task = asyncio.ensure_future(work)
    await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return 499, error_body("the client went away: the request was cancelled"), None


def _reply(status: int, out: dict[str, Any], req: ChatRequest | None) -> Response:
    if req is not None and req.stream:
        events = stream_events(out, include_usage=req.stream_usage)
        return StreamingResponse(iter(events), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return JSONResponse(out, status_code=status)


def build_app(gw: Gateway) -> FastAPI:
    """The FastAPI app of ``gw`` (routes in docs/gateway.md)."""
    app = FastAPI(title="SAO gateway", docs_url=None, redoc_url=None, openapi_url=None)

    async def chat(key: str, request: Request) -> Response:
        try:
            body = read_json(await request.body())
        except RequestError as e:
            return JSONResponse(error_body(str(e)), status_code=400)
        if body is None:
            return JSONResponse(error_body("the request body is empty: send a JSON object with 'messages'"), 400)
        watcher = asyncio.ensure_future(_until_disconnect(request))
        try:
            status, out, req = await _unless_gone(gw.chat_completion(key, body, watcher.done), watcher)
        finally:
            watcher.cancel()
        return _reply(status, out, req)

    @app.post("/s/{key}/v1/chat/completions")
    async def chat_in_path(key: str, request: Request) -> Response:
        return await chat(key, request)

    @app.post("/v1/chat/completions")
    async def chat_by_key(request: Request) -> Response:
        key = _bearer(request)
        if not key:
            msg = "no session: send the session's key as the API key (Authorization: Bearer <key>) or use /s/<key>/v1"
            return JSONResponse(error_body(msg, kind="authentication_error"), status_code=401)
        return await chat(key, request)

    @app.get("/s/{key}/v1/models")
    async def models_in_path(key: str) -> JSONResponse:
        return JSONResponse(gw.models_body())

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(gw.models_body())

    @app.post("/sessions")
    async def open_session(request: Request) -> JSONResponse:
        try:
            body = read_json(await request.body())
        except RequestError as e:
            return JSONResponse(error_body(str(e)), status_code=400)
        status, out = gw.open_from_http(body)
        return JSONResponse(out, status_code=status)

    @app.post("/s/{key}/close")
    async def close(key: str, request: Request) -> JSONResponse:
        status, out = await gw.close_from_http(key, await request.body())
        return JSONResponse(out, status_code=status)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"ok": True, "sessions": len(gw.open_sessions)})

    return app
