"""The gateway's replies in the OpenAI chat-completions format: tool calls out of the model's text, whole
``chat.completion`` objects (with logprobs when asked), their server-sent ``chat.completion.chunk`` events, errors.

Pure functions, no HTTP (``wire`` checks requests)."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Sequence
from typing import Any

from sao.envs.protocols import FormatError
from sao.envs.tools.parsing import parse_action

_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)


def split_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """(content, OpenAI tool_calls) of the model's text: every closed ``<tool_call>`` block, parsed by the envs'
    parser. If any block does not parse, nothing is a call: the whole text comes back as content, so the harness
    shows the model its own malformed call."""
    blocks = _BLOCK.findall(text)
    calls = []
    for block in blocks:
        try:
            call = parse_action(block)
        except FormatError:
            return text, []
        calls.append(
            {
                "id": "call_" + uuid.uuid4().hex[:24],
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
        )
    return (_BLOCK.sub("", text).strip(), calls) if calls else (text, [])


def logprobs_body(tokens: Sequence[str], logprobs: Sequence[float]) -> dict[str, Any]:
    """A choice's OpenAI ``logprobs``: each sampled token's text and the logprob the engine reported for it (no
    alternatives: ``top_logprobs`` is refused)."""
    return {
        "content": [
            {"token": t, "logprob": float(lp), "bytes": list(t.encode("utf-8")), "top_logprobs": []}
            for t, lp in zip(tokens, logprobs, strict=True)
        ],
        "refusal": None,
    }


def completion_body(
    *, model: str, content: str, tool_calls: list[dict[str, Any]], finish_reason: str, prompt_tokens: int,
    completion_tokens: int, logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """An OpenAI ``chat.completion`` object with one choice and the token usage."""
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not tool_calls else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": logprobs}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def stream_events(body: dict[str, Any], *, include_usage: bool) -> list[str]:
    """A whole ``chat.completion`` (``completion_body``) as the server-sent events of a streamed one: OpenAI
    ``chat.completion.chunk`` objects (the role, the content with its logprobs, the tool calls, the finish reason,
    the usage when asked), each ``data: {json}`` and a blank line, then ``data: [DONE]``. The action is sampled and
    recorded whole before the first event, so a streaming client trains like any other."""
    choice = body["choices"][0]
    message, logprobs = choice["message"], choice["logprobs"]
    head = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None, lp: Any = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}], **extra}

    chunks = [chunk({"role": "assistant", "content": ""})]
    if message["content"] or logprobs is not None:
        chunks.append(chunk({"content": message["content"] or ""}, lp=logprobs))
    if message.get("tool_calls"):
        calls = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        chunks.append(chunk({"tool_calls": calls}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        chunks.append({**head, "choices": [], "usage": body["usage"]})
    return [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None) -> dict[str, Any]:
    """An OpenAI error object (what the ``openai`` client reads into its exception's message)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}
