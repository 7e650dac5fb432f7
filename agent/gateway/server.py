"""``Gateway``: an OpenAI-compatible HTTP server in front of a trainable engine; one private session per episode.

Each session gets an unguessable key (``secrets.token_urlsafe``): its base URL is ``{url}/s/{key}/v1``, and the
same routes answer under ``/v1/...`` with the key as the API key (``Authorization: Bearer <key>``). The session id
(a run's episode name) is for the opener only: no reply names another session, and a key that ended answers 410
(never a new session). ``POST /s/{key}/close`` (a JSON body ``{"reward": ..., "task_id": ..., "status": ...,
"info": {...}}``) and ``POST /sessions`` (open one, answered with its base URL and key) serve a user's own process
when the gateway has an ``on_close`` sink (``sao serve --gateway``). The routes are in ``routes``; the contract
(every malformed request a 4xx naming the problem, streaming, disconnects, closes in flight) in docs/gateway.md.
The server is uvicorn's, run as a task of the caller's event loop (``start`` / ``stop``); the engine is awaited in
the same loop, so an in-process engine batches the sessions' requests together.
"""

from __future__ import annotations

import asyncio
import math
import re
import secrets
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sao.agent.chat import ChatRenderer, ChatTemplateError
from sao.agent.engines.protocols import Engine, EngineError
from sao.agent.gateway.replies import completion_body, error_body, logprobs_body
from sao.agent.gateway.session import ClientGone, GatewaySession, SessionClosed, SessionLimits, SessionRecord
from sao.agent.gateway.wire import ChatRequest, RequestError, parse_request, read_json

_SESSION_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_ENDED_KEPT = 65536  # ended sessions remembered (key and id) so that neither is silently reused


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
        """The close a body asks for (None: an empty body, no outcome); ``RequestError`` naming the field."""
        if body is None:
            return cls()
        if not isinstance(body, dict):
            raise RequestError('the close body must be a JSON object like {"reward": 1.0}')
        reward = body.get("reward")
        if reward is not None and (
            isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward)
        ):
            raise RequestError(f"reward={reward!r} must be a finite number or null", "reward")
        info = body.get("info") or {}
        if not isinstance(info, dict):
            raise RequestError("info must be a JSON object", "info")
        status = body.get("status") or ""
        if status not in ("", "ok", "truncated", "infra_error"):
            raise RequestError(f"status={status!r} must be ok, truncated or infra_error", "status")
        names = {k: body.get(k) for k in ("task_id", "env_id")}
        for k, v in names.items():
            if v is not None and not isinstance(v, str):
                raise RequestError(f"{k}={v!r} must be a string", k)
        return cls(None if reward is None else float(reward), names["task_id"] or "", names["env_id"] or "gateway",
                   status, info)  # fmt: skip


class SessionEnded(LookupError):
    """A request for a session that was closed (HTTP 410): its key opens nothing again."""


class Gateway:
    """The OpenAI-compatible gateway (see the module doc and ``sao.agent.gateway.session`` for the rows).

    ``temperature``: the run's; a request may leave it out or repeat it (``fixed_temperature=False``: any, for
    evaluation). ``open_over_http``: ``POST /sessions`` opens a session (``sao serve --gateway``); otherwise
    sessions are opened by ``open_session``. ``on_close``: called with the record and the body of
    ``POST /s/{key}/close``; without it that route is refused (the opener closes its sessions).
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
        open_over_http: bool = False,
        on_close: Callable[[SessionRecord, CloseRequest], None] | None = None,
    ) -> None:
        from sao.agent.gateway.routes import build_app

        self.engine, self.model_name = engine, model_name
        self.limits = SessionLimits(max_context_tokens, max_action_tokens)
        self.chat = ChatRenderer(tokenizer, tool_role)
        self.temperature, self.fixed_temperature = float(temperature), fixed_temperature
        self.open_over_http, self.on_close = open_over_http, on_close
        self._sessions: dict[str, GatewaySession] = {}  # by session id
        self._keys: dict[str, str] = {}  # key -> session id
        self._ended: dict[str, str] = {}  # ended keys and ids -> why (the newest _ENDED_KEPT)
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._url = ""
        self.app = build_app(self)

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
        """Open a session (a fresh id when None) and return its OpenAI base URL ``{url}/s/{key}/v1``: the key
        (``session_key``) is unguessable and is the only way in over HTTP. An id is used once: reopening one
        that is open or ended raises ``ValueError``."""
        sid = session_id or uuid.uuid4().hex
        if not _SESSION_ID.match(sid):
            raise ValueError(f"session id {sid!r}: use 1-128 letters, digits, '.', '_' or '-'")
        if sid in self._sessions or sid in self._ended:
            state = "open" if sid in self._sessions else f"ended ({self._ended[sid]})"
            raise ValueError(f"session id {sid!r} is {state}: an id is used once; pick a fresh one")
        session = GatewaySession(sid, self.engine, self.chat, self.limits)
        session.key = secrets.token_urlsafe(24)
        self._sessions[sid], self._keys[session.key] = session, sid
        return f"{self.url}/s/{session.key}/v1"

    def session_key(self, session_id: str) -> str:
        """The open session's key: its base URL's path part and its API key on ``/v1``."""
        return self._open(session_id).key

    def close_session(self, session_id: str, why: str = "closed by its opener") -> SessionRecord:
        """End a session now and return its record; a request in flight is discarded when the engine answers
        (``SessionRecord.discarded``; the client gets 410). ``aclose_session`` waits for it instead."""
        session = self._open(session_id)
        del self._sessions[session_id], self._keys[session.key]
        session.discarded += int(session.busy)  # the call in flight will not be recorded
        session.closing = session.closed = True
        for name in (session_id, session.key):
            self._ended[name] = why
        while len(self._ended) > 2 * _ENDED_KEPT:
            del self._ended[next(iter(self._ended))]
        return session.record()

    async def aclose_session(self, session_id: str, why: str = "closed by its opener") -> SessionRecord:
        """End a session once its request in flight (if any) is answered and recorded; requests arriving
        meanwhile get 410."""
        session = self._open(session_id)
        session.closing = True
        await session.wait_idle()
        if self._sessions.get(session_id) is not session:  # closed meanwhile by its opener or as idle
            return session.record()
        return self.close_session(session_id, why)

    def record(self, session_id: str) -> SessionRecord:
        """The record of an open session so far (it stays open)."""
        return self._open(session_id).record()

    def context_exhausted(self, session_id: str) -> bool:
        """Whether the open session's context budget is spent (cheap: no record is built)."""
        return self._open(session_id).context_exhausted

    @property
    def open_sessions(self) -> list[str]:
        return list(self._sessions)

    def idle_sessions(self, idle_s: float, now: float) -> list[str]:
        """Open sessions with no request for ``idle_s`` seconds by ``now`` (``time.monotonic()``)."""
        return [sid for sid, s in self._sessions.items() if now - s.last_active >= idle_s and not s.busy]

    def _open(self, session_id: str) -> GatewaySession:
        session = self._sessions.get(session_id)
        if session is None:
            why = self._ended.get(session_id)
            raise KeyError(f"session {session_id!r} " + (f"has ended ({why})" if why else "was never opened"))
        return session

    def by_key(self, key: str) -> GatewaySession:
        """The open session of ``key``; ``SessionEnded`` (410) for an ended one, ``LookupError`` (404) else."""
        sid = self._keys.get(key)
        if sid is not None:
            return self._sessions[sid]
        why = self._ended.get(key)
        if why is not None:
            raise SessionEnded(f"this session has ended ({why}): its key opens nothing again; open a new session")
        raise LookupError(
            "no open session has this key: open one with Gateway.open_session (a run does this per episode) or "
            "POST /sessions (sao serve --gateway), and use the base URL it returns"
        )

    # ---- requests ----------------------------------------------------------------------------------------------
    async def chat_completion(
        self, key: str, body: Any, gone: Callable[[], bool] = lambda: False
    ) -> tuple[int, dict[str, Any], ChatRequest | None]:
        """(HTTP status, JSON body, the checked request when answered) for one chat request to the session of
        ``key``; ``gone``: whether the client went away (its action is then discarded)."""
        req = None
        try:
            session = self.by_key(key)
            req = parse_request(body, temperature=self.temperature, fixed_temperature=self.fixed_temperature)
            reply = await session.complete(req, gone)
        except RequestError as e:
            return 400, error_body(str(e), param=e.param), None
        except ChatTemplateError as e:
            return 400, error_body(f"the chat template cannot render these messages: {e}", param="messages"), None
        except (SessionEnded, SessionClosed) as e:
            return 410, error_body(str(e), kind="not_found_error"), None
        except LookupError as e:
            return 404, error_body(str(e), kind="not_found_error"), None
        except EngineError as e:
            return 502, error_body(f"the engine failed: {e}", kind="engine_error"), None
        except ClientGone as e:
            return 499, error_body(str(e)), None
        tokens = [self.chat.tokenizer.decode([t]) for t in reply.token_ids] if req.logprobs else []
        out = completion_body(
            model=self.model_name,
            content=reply.content,
            tool_calls=reply.tool_calls,
            finish_reason=reply.finish_reason,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            logprobs=logprobs_body(tokens, reply.logprobs) if req.logprobs else None,
        )
        return 200, out, req

    def open_from_http(self, body: Any) -> tuple[int, dict[str, Any]]:
        """``POST /sessions``: open a session (``{"session_id": ...}`` optional) and answer its base URL and key."""
        if not self.open_over_http:
            msg = "this gateway's sessions are opened by the process that runs it (Gateway.open_session)"
            return 400, error_body(msg)
        label = body.get("session_id") if isinstance(body, dict) else None
        if body is not None and (not isinstance(body, dict) or not isinstance(label, str | None)):
            return 400, error_body('the body must be empty or a JSON object like {"session_id": "ep-1"}')
        try:
            base_url = self.open_session(label)
        except ValueError as e:
            return 400, error_body(str(e), param="session_id")
        key = base_url.split("/s/", 1)[1].split("/", 1)[0]
        return 200, {
            "session_id": self._keys[key],
            "base_url": base_url,
            "api_key": key,
            "close_url": f"{self.url}/s/{key}/close",
        }

    async def close_from_http(self, key: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        """``POST /s/{key}/close``: a body that does not parse is refused and the session stays open; otherwise
        the close waits for the request in flight, then ``on_close`` gets the record."""
        if self.on_close is None:
            msg = "this gateway's sessions are closed by the process that opened them (Gateway.close_session)"
            return 400, error_body(msg)
        try:
            close = CloseRequest.from_body(read_json(raw))
            session = self.by_key(key)
        except RequestError as e:
            return 400, error_body(str(e) + "; the session is still open", param=e.param)
        except SessionEnded as e:
            return 410, error_body(str(e), kind="not_found_error")
        except LookupError as e:
            return 404, error_body(str(e), kind="not_found_error")
        if session.closing:
            return 409, error_body("this session is already closing (another close is waiting for its request)")
        record = await self.aclose_session(session.session_id, "closed over HTTP")
        self.on_close(record, close)
        summary = {k: getattr(record, k) for k in ("session_id", "prefix_breaks", "calls", "context_exhausted")}
        return 200, {**summary, "rows": len(record.rows), "discarded": record.discarded}

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
