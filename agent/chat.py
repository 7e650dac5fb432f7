"""Chat rendering for token-in/token-out episodes: the first prompt, then only each new message as token ids.

How a new message is turned into tokens (the prefix-stability handling):
the agent never re-renders the whole conversation. After an action it renders a fixed probe conversation
``[user "x", assistant SENTINEL, <new message>]`` with ``add_generation_prompt=True`` and keeps the text after
``SENTINEL``: what the template writes between the end of an assistant's content and the start of the next
assistant's content (e.g. ChatML: ``<|im_end|>\\n<|im_start|>user\\n{obs}<|im_end|>\\n<|im_start|>assistant\\n``).
If the sampled action already ends with the template's end-of-turn token (the model emitted ``<|im_end|>``),
that text is not repeated. Everything in that delta is an observation token (written by the env/template, never
trained on). For a template that renders each message independently of later ones (ChatML, SmolLM2, Llama-3,
Qwen2.5) the concatenated segments equal the rendering of the whole conversation; a template that rewrites
earlier turns (e.g. Qwen3 dropping ``<think>`` blocks of past turns) is not prefix-stable: the agent then keeps
what the model actually saw, which differs from a fresh rendering of the same messages, on purpose.

Tools: when the chat template uses a ``tools`` variable they are passed with ``tools=``; otherwise their JSON
schemas are appended to the system prompt with the ``<tool_call>`` text format below (``TOOLS_TEXT_FORMAT``),
which is what the env parsers read (see ``envs/protocols.py``).
"""

from __future__ import annotations

import json
from typing import Any

TOOLS_TEXT_FORMAT = (
    "\n\n# Tools\nYou can call the functions below. To call one, write exactly one block\n"
    '<tool_call>{{"name": <function name>, "arguments": <JSON object>}}</tool_call>\n'
    "and stop; the result comes back in the next message.\nAvailable functions (JSON schemas):\n{schemas}"
)
_SENTINEL = "\x00SAO_SENTINEL\x00"


class ChatTemplateError(ValueError):
    """The tokenizer cannot render the conversation (no chat template, or the template rejects a role)."""


def template_supports_tools(tokenizer: Any) -> bool:
    """True when the tokenizer's chat template reads a ``tools`` variable."""
    tmpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tmpl, dict):
        tmpl = tmpl.get("tool_use") or tmpl.get("default") or ""
    return isinstance(tmpl, str) and "tools" in tmpl


def tools_as_text(tools: list[dict[str, Any]]) -> str:
    """The documented text fallback for templates without tool support, appended to the system prompt."""
    return TOOLS_TEXT_FORMAT.format(schemas="\n".join(json.dumps(t) for t in tools))


class ChatRenderer:
    """Renders the first prompt and each later message of an episode to token ids with one tokenizer."""

    def __init__(self, tokenizer: Any, tool_role: str = "auto") -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat_template; "
                "use an instruct/chat model or set tokenizer.chat_template"
            )
        self.tokenizer = tokenizer
        self.native_tools = template_supports_tools(tokenizer)
        # A template without tool support never saw a "tool" role: tool results go back as user messages.
        self.tool_role = ("tool" if self.native_tools else "user") if tool_role == "auto" else tool_role
        self._eot_texts = self._end_of_turn_texts()

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool) -> str:
        kw: dict[str, Any] = {"tokenize": False, "add_generation_prompt": gen}
        if tools and self.native_tools:
            kw["tools"] = tools
        try:
            return str(self.tokenizer.apply_chat_template(messages, **kw))
        except Exception as e:  # the template raises jinja errors of many kinds
            roles = [m.get("role") for m in messages]
            raise ChatTemplateError(f"the chat template cannot render roles {roles}: {e}") from e

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def initial_messages(
        self, system_prompt: str | None, task: str, tools: list[dict[str, Any]] | None
    ) -> list[dict[str, Any]]:
        system = system_prompt or ""
        if tools and not self.native_tools:
            system += tools_as_text(tools)
        msgs: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        return [*msgs, {"role": "user", "content": task}]

    def render_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of the first prompt, ending with the assistant generation header."""
        return self._encode(self._render(messages, tools, gen=True))

    def render_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The text of a whole conversation rendered at once, ending with the assistant generation header."""
        return self._render(messages, tools, gen=True)

    def render_full(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of a whole conversation rendered at once (for checks; the agent never uses it)."""
        return self._encode(self._render(messages, tools, gen=True))

    def message(self, role: str, content: str) -> dict[str, Any]:
        return {"role": self.tool_role if role == "tool" else role, "content": content}

    def render_after_action(self, action_ids: list[int], message: dict[str, Any]) -> list[int]:
        """Tokens that follow a sampled action: the template's end of the assistant turn (unless the model
        already emitted it), ``message``, and the next assistant generation header."""
        return self.render_after_action_messages(action_ids, [message])

    def render_after_action_messages(self, action_ids: list[int], messages: list[dict[str, Any]]) -> list[int]:
        """``render_after_action`` for several messages at once (e.g. one tool result per call of the action), each
        rendered as its own message by the template, as a whole-conversation rendering would."""
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}, *messages]
        text = self._render(probe, None, gen=True)
        cut = text.rfind(_SENTINEL)
        if cut < 0:
            raise ChatTemplateError("the chat template does not render assistant content verbatim")
        delta = text[cut + len(_SENTINEL) :]
        tail = self.tokenizer.decode(action_ids[-1:], skip_special_tokens=False) if action_ids else ""
        if tail in self._eot_texts and delta.startswith(tail):
            delta = delta[len(tail) :]
        return self._encode(delta)

    def action_text(self, action_ids: list[int]) -> str:
        """The action as text for the env (special tokens such as the end-of-turn token dropped)."""
        return str(self.tokenizer.decode(action_ids, skip_special_tokens=True))

    def _end_of_turn_texts(self) -> set[str]:
        texts = set()
        for tid in self.stop_token_ids():
            texts.add(self.tokenizer.decode([tid], skip_special_tokens=False))
        return texts

    def stop_token_ids(self) -> list[int]:
        """Token ids that end an assistant turn: the tokenizer's EOS plus the template's end-of-turn token."""
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        for tok in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
            tid = self.tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id and tid >= 0:
                ids.add(tid)
        return sorted(ids)
