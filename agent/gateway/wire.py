"""The OpenAI chat-completions format at the gateway: request checks and the messages' normal form (``replies``
writes the answers).

Pure functions, no HTTP. A request is refused (``RequestError``, HTTP 400, naming the setting) when it asks for
sampling the DIS ratio cannot honour: SAO trains on the logprobs the engine reports while sampling, which the
learner recomputes as ``log_softmax(logits / temperature)``; truncation (top-p, top-k, min-p), penalties, logit
biases, constrained decoding and several choices per request make the sampled distribution something else (the
trainer refuses ``rollout.top_p`` / ``rollout.top_k`` for the same reason).

Two messages are the same turn when their normal forms are equal (``normal_message``): role, text content (text
parts joined), tool calls as (name, arguments as canonical JSON), so a harness that re-serialises the tool calls
it got back (other key order, other spacing) still extends its episode.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sao.agent.chat import ChatRenderer, tools_as_text
from sao.agent.conversation import ConversationError, assistant_text

_ROLES = ("system", "developer", "user", "assistant", "tool")
_DIS = (
    "SAO trains on the engine's own logprobs (the DIS ratio), which must be those of the plain softmax of "
    "logits / temperature"
)


class RequestError(ValueError):
    """A request the gateway refuses (HTTP 400); ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _off(default: Any) -> Callable[[Any], bool]:
    """A check that passes for ``None`` and for ``default`` (the setting's neutral value)."""
    return lambda v: v is None or v == default


# Setting -> (is it harmless?, what it does to the distribution). A value of the wrong type is refused too.
_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "top_p": (lambda v: v is None or float(v) == 1.0, "top-p truncates the distribution"),
    "top_k": (lambda v: v is None or int(v) in (0, -1), "top-k truncates the distribution"),
    "min_p": (lambda v: v is None or float(v) == 0.0, "min-p truncates the distribution"),
    "typical_p": (lambda v: v is None or float(v) == 1.0, "typical sampling truncates the distribution"),
    "presence_penalty": (lambda v: v is None or float(v) == 0.0, "a penalty shifts the logits"),
    "frequency_penalty": (lambda v: v is None or float(v) == 0.0, "a penalty shifts the logits"),
    "repetition_penalty": (lambda v: v is None or float(v) == 1.0, "a penalty shifts the logits"),
    "logit_bias": (lambda v: not v, "a logit bias shifts the logits"),
    "bad_words": (lambda v: not v, "banned words mask tokens"),
    "allowed_token_ids": (lambda v: not v, "an allow-list masks tokens"),
    "min_tokens": (lambda v: v is None or int(v) == 0, "min_tokens masks the end-of-turn token"),
    "n": (_off(1), "the gateway records one sample per request; send n separate requests"),
    "best_of": (_off(1), "best-of picks among samples"),
    "use_beam_search": (lambda v: not v, "beam search is not sampling"),
    "response_format": (lambda v: not v or v.get("type") == "text", "constrained decoding masks tokens"),
    "guided_json": (lambda v: not v, "constrained decoding masks tokens"),
    "guided_regex": (lambda v: not v, "constrained decoding masks tokens"),
    "guided_choice": (lambda v: not v, "constrained decoding masks tokens"),
    "guided_grammar": (lambda v: not v, "constrained decoding masks tokens"),
    "structured_outputs": (lambda v: not v, "constrained decoding masks tokens"),
}


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat request: the messages as sent, the tools, and how to sample.

    ``max_tokens``: the request's own cap (None: the session's); ``parse_tool_calls``: reply with OpenAI
    ``tool_calls`` when the model writes ``<tool_call>`` blocks (the request has tools and ``tool_choice`` is not
    ``"none"``); ``logprobs``: the reply carries each sampled token's logprob; ``stream``: the reply is sent as
    server-sent ``chat.completion.chunk`` events (``stream_usage``: with a last chunk holding the usage)."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    max_tokens: int | None = None
    temperature: float = 1.0
    stop: tuple[str, ...] = ()
    parse_tool_calls: bool = False
    logprobs: bool = False
    stream: bool = False
    stream_usage: bool = False


def parse_request(body: Any, *, temperature: float, fixed_temperature: bool) -> ChatRequest:
    """Check a ``/chat/completions`` body; raise ``RequestError`` naming the setting and the fix.

    ``temperature``: the gateway's (the run's) temperature, used when the request gives none; with
    ``fixed_temperature`` a request asking for another one is refused (a training run samples at one temperature).
    """
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object with 'messages'", None)
    for name, (harmless, why) in _REFUSED.items():
        value = body.get(name)
        try:
            ok = harmless(value)
        except (TypeError, ValueError, AttributeError):
            ok = False
        if not ok:
            raise RequestError(
                f"{name}={value!r} is refused: {why}, and {_DIS}; leave {name} out of the request "
                "(e.g. drop it from the harness's model kwargs)",
                name,
            )
    return ChatRequest(
        messages=_messages(body.get("messages")),
        tools=_tools(body.get("tools")),
        max_tokens=_max_tokens(body),
        temperature=_temperature(body.get("temperature"), temperature, fixed_temperature),
        stop=_stop(body.get("stop")),
        parse_tool_calls=_tool_choice(body.get("tool_choice")) and bool(body.get("tools")),
        logprobs=_logprobs(body),
        stream=_flag(body, "stream"),
        stream_usage=_stream_usage(body),
    )


def read_json(raw: bytes) -> Any:
    """A request body as JSON (None when empty); ``RequestError`` for what is not strict JSON: invalid UTF-8 or
    syntax, the NaN / Infinity constants Python's parser accepts, a number too large for a float, a lone surrogate
    (``"\\ud800"``: no tokenizer can encode it)."""
    if not raw.strip():
        return None

    def no_constant(name: str) -> Any:
        raise RequestError(f"{name} is not JSON: send a finite number or null")

    try:
        body = json.loads(raw, parse_constant=no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(f"the request body is not JSON ({e}); send a JSON object") from None
    _check_values(body, "body")
    return body


def _check_values(value: Any, where: str) -> None:
    """Every string encodable as UTF-8 and every number finite, or ``RequestError`` naming where."""
    stack = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise RequestError(
                    f"{at}: a lone surrogate (\\ud800-\\udfff) is no text; send valid UTF-16 pairs or UTF-8"
                ) from None
        elif isinstance(v, float) and not math.isfinite(v):
            raise RequestError(f"{at}: {v} is out of range; send a finite number") from None
        elif isinstance(v, dict):
            stack += [(x, f"{at}.{k}") for k, x in v.items()] + [(k, f"{at} key {k[:40]!r}") for k in v]
        elif isinstance(v, list):
            stack += [(x, f"{at}[{i}]") for i, x in enumerate(v)]


def _messages(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not value:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", "messages")
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            role = m.get("role") if isinstance(m, dict) else m
            raise RequestError(f"messages[{i}]: role {role!r} is not one of {list(_ROLES)}", "messages")
        normal_message(m, i)  # content and tool calls readable
    return tuple(value)


def _tools(value: Any) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    shape = "'tools' must be a list of {type: function, function: {name, parameters}} objects"
    if not isinstance(value, list):
        raise RequestError(shape, "tools")
    for i, t in enumerate(value):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(f"{shape}; tools[{i}] is {str(t)[:80]}", "tools")
    return tuple(value)


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise RequestError(f"{name}={value!r} must be true, false or null", name)
    return bool(value)


def _logprobs(body: dict[str, Any]) -> bool:
    top = body.get("top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top != 0):
        raise RequestError(
            f"top_logprobs={top!r} is refused: the engine reports the sampled token's logprob only; "
            "leave top_logprobs out (logprobs=true alone is served)",
            "top_logprobs",
        )
    return _flag(body, "logprobs")


def _stream_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise RequestError(
            f"stream_options={options!r} must be an object like {{'include_usage': true}}", "stream_options"
        )
    return bool(options.get("include_usage"))


def _tool_choice(value: Any) -> bool:
    """Whether tool calls are parsed out of the reply; a choice the gateway cannot enforce is refused."""
    if value in (None, "auto"):
        return True
    if value == "none":
        return False
    raise RequestError(
        f"tool_choice={value!r} is refused: forcing a call needs constrained decoding, and {_DIS}; "
        "use tool_choice 'auto' (or leave it out)",
        "tool_choice",
    )


def _max_tokens(body: dict[str, Any]) -> int | None:
    caps = []
    for name in ("max_completion_tokens", "max_tokens"):
        v = body.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise RequestError(f"{name}={v!r} must be an integer >= 1", name)
        caps.append(v)
    return min(caps) if caps else None


def _temperature(value: Any, run_temperature: float, fixed: bool) -> float:
    if value is None:
        return run_temperature
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise RequestError(f"temperature={value!r} must be a finite number >= 0", "temperature")
    if fixed and float(value) != run_temperature:
        raise RequestError(
            f"temperature={value!r} differs from the run's temperature {run_temperature}: the learner recomputes "
            f"logprobs at the run's temperature, so the DIS ratios would be wrong; send temperature "
            f"{run_temperature} or leave it out",
            "temperature",
        )
    return float(value)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(f"stop={value!r} must be a non-empty string or a list of them", "stop")
    return tuple(stops)


# ---- messages ----------------------------------------------------------------------------------------------------
def content_text(content: Any, where: str) -> str:
    """A message's content as text: a string, None (empty) or a list of text parts (joined by newlines)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise RequestError(f"{where}: only text content parts are supported, got {str(part)[:80]}", "messages")
            texts.append(part["text"])
        return "\n".join(texts)
    raise RequestError(f"{where}: 'content' must be a string, null or a list of text parts", "messages")


def _canonical_arguments(args: Any) -> str:
    """Tool call arguments as canonical JSON (parsed when a JSON string); unparseable text stays as it is."""
    if isinstance(args, str):
        text = args
        try:
            args = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError:
            return text
    return json.dumps(args, sort_keys=True)


def normal_message(m: dict[str, Any], i: int = 0) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """(role, text, tool calls as (name, canonical arguments)): what makes two messages the same turn."""
    calls = []
    listed = m.get("tool_calls")
    if listed is not None and not isinstance(listed, list):
        raise RequestError(
            f"messages[{i}]: 'tool_calls' must be a list of tool calls, got {str(listed)[:80]}", "messages"
        )
    for c in listed or []:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"messages[{i}]: a tool call needs function.name, got {str(c)[:80]}", "messages")
        calls.append((fn["name"], _canonical_arguments(fn.get("arguments", {}))))
    return str(m["role"]), content_text(m.get("content"), f"messages[{i}]"), tuple(calls)


def template_messages(
    chat: ChatRenderer, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    """The request's messages as the chat template takes them: assistant tool calls as the ``<tool_call>`` text the
    policy writes, tool results in the renderer's tool role, and (for a template without tool support) the tool
    schemas at the end of the system prompt, as ``sao.agent.conversation`` renders SFT data."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role, text, _ = normal_message(m, i)
        if role == "assistant":
            try:
                text = assistant_text({"content": text, "tool_calls": m.get("tool_calls")})
            except ConversationError as e:
                raise RequestError(f"messages[{i}]: {e}", "messages") from e
            out.append({"role": "assistant", "content": text})
        elif role == "tool":
            out.append(chat.message("tool", text))
        else:
            out.append({"role": "system" if role == "developer" else role, "content": text})
    if tools and not chat.native_tools:
        schemas = tools_as_text(list(tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + schemas}
        else:
            out.insert(0, {"role": "system", "content": schemas})
    return out
