"""Test doubles for the agent: a character-level ChatML tokenizer and a scripted async env."""

from __future__ import annotations

import re
from typing import Any

SPECIALS = {"<|im_start|>": 1, "<|im_end|>": 2}
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")


class CharChatMLTokenizer:
    """One token per character (id = ord + 10), ``<|im_start|>``=1, ``<|im_end|>``=2 (EOS), ChatML template."""

    chat_template = "chatml (python)"
    eos_token_id = 2
    unk_token_id = 0
    name_or_path = "char-chatml"

    def apply_chat_template(
        self, messages: list[dict[str, Any]], tokenize: bool = False, add_generation_prompt: bool = False, **_: Any
    ) -> str:
        out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for part in _SPECIAL_RE.split(text):
            ids += [SPECIALS[part]] if part in SPECIALS else [ord(c) + 10 for c in part]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        inv = {v: k for k, v in SPECIALS.items()}
        return "".join(("" if skip_special_tokens else inv[i]) if i in inv else chr(i - 10) for i in ids)

    def convert_tokens_to_ids(self, tok: str) -> int:
        return SPECIALS.get(tok, self.unk_token_id)


class ScriptedEnv:
    """Replays ``steps``: each is (observation, reward, terminated, truncated, info); records the actions."""

    def __init__(
        self,
        steps: list[tuple[str, float, bool, bool, dict[str, Any]]],
        task: str = "Solve it.",
        system_prompt: str = "You are a test agent.",
        tools: list[dict[str, Any]] | None = None,
        fail_on_step: int | None = None,
    ) -> None:
        self.steps, self.task, self.system_prompt, self.tools = steps, task, system_prompt, tools or []
        self.actions: list[str] = []
        self.fail_on_step = fail_on_step
        self.closed = False
        self.reset_kwargs: dict[str, Any] = {}

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        self.reset_kwargs = {"seed": seed, "options": options}
        return self.task, {"role": "user", "system_prompt": self.system_prompt, "tools": self.tools}

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.actions.append(action)
        if self.fail_on_step is not None and len(self.actions) > self.fail_on_step:
            raise RuntimeError("scripted env crash")
        return self.steps[len(self.actions) - 1]

    async def aclose(self) -> None:
        self.closed = True
