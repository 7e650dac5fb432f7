"""OpenAIChatModel: any OpenAI-compatible chat endpoint (text + function calling), for evaluation only.

It returns text and tool calls, never token ids or sampling logprobs, so it cannot produce trainable
trajectories: ``generate``/``update_weights`` raise ``NotTrainableError``. Use ``sao.agent.chat_loop.run_chat_episode``
with it (``sao eval``). Tool calls are turned into the ``<tool_call>{json}</tool_call>`` text that env parsers read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import httpx

from sao.agent.engines.protocols import EngineError, Generation, SamplingParams
from sao.agent.engines.vllm_engine import TRANSIENT_HTTP_ERRORS
from sao.core.retry import RetryError, TryAgain, backoff


class NotTrainableError(TypeError):
    """An evaluation-only model was used where an Engine (token ids + logprobs) is needed."""


@dataclass(frozen=True)
class ChatReply:
    """One assistant message: its text, its tool calls (OpenAI format) and the same as env action text."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"

    @property
    def action_text(self) -> str:
        return self.content + "".join(tool_call_text(c) for c in self.tool_calls)

    def as_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


def tool_call_text(call: dict[str, Any]) -> str:
    """An OpenAI tool call as the ``<tool_call>`` block envs parse (malformed JSON arguments kept as text)."""
    fn = call.get("function") or {}
    raw = fn.get("arguments") or "{}"
    try:
        args: Any = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        # Leave it unparseable on purpose: the env answers with a format error, as for a text model.
        return f'<tool_call>{{"name": {json.dumps(fn.get("name"))}, "arguments": {raw}}}</tool_call>'
    return "<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": args}) + "</tool_call>"


class OpenAIChatModel:
    """Client of ``{base_url}/chat/completions``; ``api_key`` defaults to ``$OPENAI_API_KEY`` (may be empty)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        max_retries: int = 3,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}")
        self.base_url, self.model = base_url.rstrip("/"), model
        self.temperature, self.max_tokens, self.max_retries = temperature, max_tokens, max_retries
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=10.0), headers=headers, transport=transport
        )

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> ChatReply:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if tools:
            body["tools"] = tools
        errors: list[str] = []
        try:
            async for attempt in backoff(self.max_retries + 1, 0.5):
                with attempt:
                    choice = (await self._post(body, errors)).json()["choices"][0]
                    msg = choice.get("message") or {}
                    return ChatReply(
                        str(msg.get("content") or ""), list(msg.get("tool_calls") or []), choice.get("finish_reason")
                    )
        except RetryError:
            pass
        raise EngineError(f"{self.base_url}/chat/completions failed after {self.max_retries + 1} tries: {errors[-1]}")

    async def _post(self, body: dict[str, Any], errors: list[str]) -> httpx.Response:
        """One try: a connection error, a 5xx or a 429 joins ``errors`` and asks for another; other 4xx end it."""
        try:
            resp = await self._client.post(self.base_url + "/chat/completions", json=body)
        except TRANSIENT_HTTP_ERRORS as e:
            errors.append(f"{type(e).__name__}: {e}")
            raise TryAgain from e
        if resp.status_code < 400:
            return resp
        errors.append(f"HTTP {resp.status_code}: {resp.text[:300]}")
        if resp.status_code < 500 and resp.status_code != 429:
            raise EngineError(f"{self.base_url}/chat/completions rejected the request: {errors[-1]}")
        raise TryAgain

    @property
    def version(self) -> int:
        return 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        raise NotTrainableError(
            "OpenAIChatModel is for evaluation: a chat endpoint returns text, not token ids and sampling logprobs, "
            "so its episodes cannot be trained on. Train with VLLMEngine or HFEngine; evaluate with run_chat_episode."
        )

    async def update_weights(self, checkpoint_dir: str, version: int) -> None:
        raise NotTrainableError("OpenAIChatModel cannot load weights: it talks to a remote chat endpoint")

    async def close(self) -> None:
        await self._client.aclose()
