"""``Gateway``: an OpenAI-compatible HTTP server in front of a trainable engine; one session per episode.

Routes: ``POST /s/{session}/v1/chat/completions`` and ``GET /s/{session}/v1/models`` (the session in the base URL),
the same under ``/v1/...`` with the session as the API key (``Authorization: Bearer <session>``), and
``POST /s/{session}/close`` (a JSON body ``{"reward": ..., "task_id": ..., "status": ..., "info": {...}}``) for a
user's own process when the gateway has an ``on_close`` sink (``sao serve --gateway``). Replies are whole
(``stream: true`` is refused); a refused setting is HTTP 400 naming it, an engine failure HTTP 502, an unknown
session 404. The server is uvicorn's, run as a task of the caller's event loop (``start`` / ``stop``); the engine
is awaited in the same loop, so an in-process engine batches the sessions' requests together.
"""

from __future__ import annotations

import asyncio
import re
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from sao.agent.chat import ChatRenderer, ChatTemplateError
from sao.agent.engines.protocols import Engine, EngineError
from sao.agent.gateway.session import GatewaySession, SessionLimits, SessionRecord
from sao.agent.gateway.wire import RequestError, completion_body, error_body, parse_request

_SESSION_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


@dataclass(frozen=True)
class CloseRequest:
    """What a user's process says when it ends a session over HTTP: the episode's outcome (``reward`` None: not
    given) and how to label its trajectories."""

    reward: float | None = None
    task_id: str = ""
    env_id: str = "gateway"
    status: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Any) -> CloseRequest:
        if body is None:
            return cls()
        if not isinstance(body, dict):
            raise RequestError('the close body must be a JSON object like {"reward": 1.0}')
        reward = body.get("reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
            raise RequestError(f"reward={reward!r} must be a number or null", "reward")
        info = body.get("info") or {}
        if not isinstance(info, dict):
            raise RequestError("info must be a JSON object", "info")
        status = str(body.get("status") or "")
        if status not in ("", "ok", "truncated", "infra_error"):
            raise RequestError(f"status={status!r} must be ok, truncated or infra_error", "status")
        return cls(
            None if reward is None else float(reward),
            str(body.get("task_id") or ""),
            str(body.get("env_id") or "gateway"),
            status,
            info,
        )


class Gateway:
    """The OpenAI-compatible gateway (see the module doc and ``sao.agent.gateway.session`` for the rows).

    ``temperature``: the run's; a request may leave it out or repeat it (``fixed_temperature=False``: any, for
    evaluation). ``auto_open``: a request for an unknown session opens it (``sao serve --gateway``); otherwise
    sessions are opened by ``open_session`` and an unknown one is a 404. ``on_close``: called with the record and
    the body of ``POST /s/{id}/close``; without it that route is refused (the opener closes its sessions).
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        *,
        max_context_tokens: int,
        max_action_tokens: int,
        temperature: float = 1.0,
        tool_role: str = "auto",
        model_name: str = "sao-policy",
        fixed_temperature: bool = True,
        auto_open: bool = False,
        on_close: Callable[[SessionRecord, CloseRequest], None] | None = None,
    ) -> None:
        self.engine, self.model_name = engine, model_name
        self.limits = SessionLimits(max_context_tokens, max_action_tokens)
        self.chat = ChatRenderer(tokenizer, tool_role)
        self.temperature, self.fixed_temperature = float(temperature), fixed_temperature
        self.auto_open, self.on_close = auto_open, on_close
        self._sessions: dict[str, GatewaySession] = {}
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._url = ""
        self.app = _build_app(self)

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Serve on ``host:port`` (0: a free port) in this event loop until ``stop``."""
        import uvicorn

        if self._task is not None:
            raise RuntimeError("the gateway is already started")
        # IPPROTO_TCP said outright: asyncio sets TCP_NODELAY only on sockets that name it, and without it each
        # reply (headers, then body) waits ~40 ms for the client's delayed ACK.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        bound = sock.getsockname()[1]
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self._url = f"http://{shown}:{bound}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                await self._task  # raises what stopped it
                raise RuntimeError(f"the gateway server on {host}:{port} exited during startup")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop serving (in-flight requests finish first); open sessions stay readable."""
        if self._task is None:
            return
        task, self._task = self._task, None
        self._server.should_exit = True
        if not task.done():  # done: a signal stopped it, and uvicorn re-raises that signal itself
            await task

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def serving(self) -> bool:
        """The server is running (``start`` done, not stopped by ``stop`` or a signal)."""
        return self._task is not None and not self._task.done() and self._server.started

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        if not self._url:
            raise RuntimeError("the gateway is not started: await gateway.start() first")
        return self._url

    # ---- sessions ----------------------------------------------------------------------------------------------
    def open_session(self, session_id: str | None = None) -> str:
        """Open a session (a fresh id when None) and return its OpenAI base URL ``{url}/s/{id}/v1``."""
        sid = session_id or uuid.uuid4().hex
        if not _SESSION_ID.match(sid):
            raise ValueError(f"session id {sid!r}: use 1-128 letters, digits, '.', '_' or '-'")
        if sid in self._sessions:
            raise ValueError(f"session {sid!r} is already open; close it first or pick another id")
        self._sessions[sid] = GatewaySession(sid, self.engine, self.chat, self.limits)
        return f"{self.url}/s/{sid}/v1"

    def close_session(self, session_id: str) -> SessionRecord:
        """End a session and return its record; an unknown id raises ``KeyError`` naming the open ones."""
        try:
            session = self._sessions.pop(session_id)
        except KeyError:
            raise KeyError(f"no open session {session_id!r} (open: {sorted(self._sessions)[:5]}...)") from None
        return session.record()

    def record(self, session_id: str) -> SessionRecord:
        """The record of an open session so far (it stays open)."""
        return self._sessions[session_id].record()

    @property
    def open_sessions(self) -> list[str]:
        return list(self._sessions)

    def idle_sessions(self, idle_s: float, now: float) -> list[str]:
        """Open sessions with no request for ``idle_s`` seconds by ``now`` (``time.monotonic()``)."""
        return [sid for sid, s in self._sessions.items() if now - s.last_active >= idle_s and not s.busy]

    def _session(self, sid: str) -> GatewaySession:
        session = self._sessions.get(sid)
        if session is None and self.auto_open and _SESSION_ID.match(sid):
            self.open_session(sid)
            session = self._sessions[sid]
        if session is None:
            raise LookupError(
                f"no open session {sid!r}: open it with Gateway.open_session (a run does this per episode) "
                "and use the base URL it returns"
            )
        return session

    # ---- requests ----------------------------------------------------------------------------------------------
    async def chat_completion(self, sid: str, body: Any) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) for one chat request to session ``sid``."""
        try:
            session = self._session(sid)
            req = parse_request(body, temperature=self.temperature, fixed_temperature=self.fixed_temperature)
            reply = await session.complete(req)
        except RequestError as e:
            return 400, error_body(str(e), param=e.param)
        except ChatTemplateError as e:
            return 400, error_body(f"the chat template cannot render these messages: {e}", param="messages")
        except LookupError as e:
            return 404, error_body(str(e), kind="not_found_error")
        except EngineError as e:
            return 502, error_body(f"the engine failed: {e}", kind="engine_error")
        return 200, completion_body(
            model=self.model_name,
            content=reply.content,
            tool_calls=reply.tool_calls,
            finish_reason=reply.finish_reason,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
        )

    def close_from_http(self, sid: str, body: Any) -> tuple[int, dict[str, Any]]:
        if self.on_close is None:
            msg = "this gateway's sessions are closed by the process that opened them (Gateway.close_session)"
            return 400, error_body(msg)
        try:
            close = CloseRequest.from_body(body)
            record = self.close_session(sid)
        except RequestError as e:
            return 400, error_body(str(e), param=e.param)
        except KeyError as e:
            return 404, error_body(str(e.args[0]), kind="not_found_error")
        self.on_close(record, close)
        summary = {k: getattr(record, k) for k in ("session_id", "prefix_breaks", "calls", "context_exhausted")}
        return 200, {**summary, "rows": len(record.rows)}

    def models_body(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_name,
                    "object": "model",
                    "owned_by": "sao",
                    "max_model_len": self.limits.max_context_tokens,
                }
            ],
        }


def _bearer(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else ""


async def _json(request: Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        return None


def _build_app(gw: Gateway) -> FastAPI:
    app = FastAPI(title="SAO gateway", docs_url=None, redoc_url=None, openapi_url=None)

    async def chat(sid: str, request: Request) -> JSONResponse:
        body = await _json(request)
        if body is None:
            return JSONResponse(error_body("the request body is not JSON"), status_code=400)
        status, out = await gw.chat_completion(sid, body)
        return JSONResponse(out, status_code=status)

    @app.post("/s/{sid}/v1/chat/completions")
    async def chat_in_path(sid: str, request: Request) -> JSONResponse:
        return await chat(sid, request)

    @app.post("/v1/chat/completions")
    async def chat_by_key(request: Request) -> JSONResponse:
        sid = _bearer(request)
        if not sid:
            msg = "no session: send the session id as the API key (Authorization: Bearer <id>) or use /s/<id>/v1"
            return JSONResponse(error_body(msg, kind="authentication_error"), status_code=401)
        return await chat(sid, request)

    @app.get("/s/{sid}/v1/models")
    async def models_in_path(sid: str) -> JSONResponse:
        return JSONResponse(gw.models_body())

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(gw.models_body())

    @app.post("/s/{sid}/close")
    async def close(sid: str, request: Request) -> JSONResponse:
        status, out = gw.close_from_http(sid, await _json(request))
        return JSONResponse(out, status_code=status)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"ok": True, "sessions": len(gw.open_sessions)})

    return app
