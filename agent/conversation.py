"""A finished conversation (OpenAI messages) -> the token ids and action mask the agent would have produced.

Supervised fine-tuning must train on exactly the tokens the agent sees at rollout time, so this renders with the
agent's own ``ChatRenderer`` and in the agent loop's order: the first prompt (system + user, tool schemas as the
loop adds them), then for each assistant message its action tokens (the text the model would write plus the
template's end-of-turn token, which the model samples to stop), then the observation that follows it through
``render_after_action``. Only action tokens are marked trainable.

Assistant ``tool_calls`` (OpenAI format) become the ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
text the envs parse (``envs/tools/parsing.py``), after the message's content. Consecutive non-assistant messages
after an action (several tool results) are joined into one observation, since the loop writes one per action.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sao.agent.chat import ChatRenderer, tools_as_text

_SENTINEL = "\x00SAO_EOT\x00"


class ConversationError(ValueError):
    """The conversation cannot be rendered for training; the message says what is wrong and how to fix it."""


@dataclass(frozen=True)
class RenderedConversation:
    """``input_ids`` of the whole episode and ``action_mask`` (True on tokens the model wrote)."""

    input_ids: tuple[int, ...]
    action_mask: tuple[bool, ...]

    @property
    def num_action_tokens(self) -> int:
        return sum(self.action_mask)


def end_of_turn_ids(chat: ChatRenderer) -> list[int]:
    """The token(s) that close an assistant message in this template and stop sampling (ChatML: ``<|im_end|>``)."""
    text = chat.tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}], tokenize=False
    )
    tail = str(text)[str(text).rfind(_SENTINEL) + len(_SENTINEL) :]
    stops = set(chat.stop_token_ids())
    ids = chat.tokenizer.encode(tail, add_special_tokens=False)
    for i, tid in enumerate(ids):
        if tid in stops:
            return [int(t) for t in ids[: i + 1]]
    eos = chat.tokenizer.eos_token_id
    if eos is None:
        raise ConversationError("the tokenizer has no EOS token and its template no end-of-turn token")
    return [int(eos)]


def action_ids(chat: ChatRenderer, text: str) -> list[int]:
    """Token ids of an assistant action as the model would sample them: ``text`` then the end-of-turn token."""
    return list(chat.tokenizer.encode(text, add_special_tokens=False)) + end_of_turn_ids(chat)


def tool_call_text(call: dict[str, Any]) -> str:
    """One OpenAI ``tool_calls`` entry as the ``<tool_call>`` text the env parsers read."""
    fn = call.get("function", call)
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        raise ConversationError(f"a tool call has no function name: {call!r}; write {{'function': {{'name': ...}}}}")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ConversationError(f"tool call {name!r}: 'arguments' is a string that is not JSON ({e.msg})") from e
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def assistant_text(message: dict[str, Any]) -> str:
    """The text an assistant message stands for: its content, then its tool calls in the env's text format."""
    parts = [str(message.get("content") or "")]
    parts += [tool_call_text(c) for c in message.get("tool_calls") or []]
    return "\n".join(p for p in parts if p)


def render_conversation(
    chat: ChatRenderer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> RenderedConversation:
    """Render ``messages`` like the agent loop would have (see the module doc); raise ``ConversationError``."""
    if not isinstance(messages, list) or not messages:
        raise ConversationError("'messages' must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ConversationError(f"message {i} has no 'role': {m!r}; each message needs role and content")
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise ConversationError("the conversation has no assistant message: nothing to train on; add one")
    if first == 0:
        raise ConversationError("the conversation starts with an assistant message; put the task in a user message")
    head = [{"role": m["role"], "content": str(m.get("content") or "")} for m in messages[:first]]
    if tools and not chat.native_tools:
        # What ChatRenderer.initial_messages does: the schemas go at the end of the system prompt.
        if head[0]["role"] == "system":
            head[0] = {"role": "system", "content": head[0]["content"] + tools_as_text(tools)}
        else:
            head.insert(0, {"role": "system", "content": tools_as_text(tools)})
    ids = chat.render_prompt(head, tools)
    mask = [False] * len(ids)
    i = first
    while i < len(messages):
        act = action_ids(chat, assistant_text(messages[i]))
        ids += act
        mask += [True] * len(act)
        j = i + 1
        obs: list[str] = []
        while j < len(messages) and messages[j]["role"] != "assistant":
            obs.append(str(messages[j].get("content") or ""))
            j += 1
        if obs and j < len(messages):  # an observation after the last action is never shown to the model
            o = chat.render_after_action(act, chat.message(messages[i + 1]["role"], "\n".join(obs)))
            ids += o
            mask += [False] * len(o)
        i = j
    return RenderedConversation(tuple(ids), tuple(mask))
