"""Replayed models: ``ScriptedEngine`` replays fixed actions (token ids with logprobs) in order, for loop tests and
dry runs; ``ScriptedChat`` replays one task's assistant messages from a script file (model spec ``scripted:FILE``).

A script is a JSONL of ``{"id": <instance or problem id>, "actions": ["<assistant message>", ...]}``; the same
script is replayed for every sample of a task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sao.agent.engines.openai_chat import ChatReply
from sao.agent.engines.protocols import EngineError, Generation, SamplingParams
from sao.agent.engines.registry import ModelSpecError
from sao.core.jsonl import iter_jsonl


class ScriptedEngine:
    """Returns ``outputs[i]`` on the i-th call (cut at ``max_tokens``); ``fail_after`` raises EngineError from
    that call on, ``fail_attempts`` on those attempts only (0-based, failed ones counted: a transient failure)."""

    def __init__(
        self,
        outputs: Sequence[Sequence[int]],
        *,
        logprob: float = -0.5,
        version: int = 0,
        delay_s: float = 0.0,
        fail_after: int | None = None,
        fail_attempts: Sequence[int] = (),
    ) -> None:
        self.outputs = [list(o) for o in outputs]
        self.logprob, self._version, self.delay_s, self.fail_after = logprob, version, delay_s, fail_after
        self.fail_attempts, self.attempts = set(fail_attempts), 0
        self.prompts: list[list[int]] = []

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        n = len(self.prompts)
        self.attempts += 1
        if self.attempts - 1 in self.fail_attempts:
            raise EngineError("scripted transient engine failure")
        if self.fail_after is not None and n >= self.fail_after:
            raise EngineError("scripted engine failure")
        self.prompts.append(list(prompt_ids))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        out = self.outputs[n % len(self.outputs)]
        cut = out[: sampling.max_tokens]
        reason = "length" if len(cut) < len(out) else "stop"
        return Generation(tuple(cut), tuple(self.logprob for _ in cut), reason, self._version)

    async def update_weights(self, checkpoint_dir: str, version: int) -> None:
        self._version = version

    async def close(self) -> None:
        return None


def load_script(path: str | Path) -> dict[str, list[str]]:
    """A script's actions per task id; errors (``ModelSpecError``) name the line."""
    out: dict[str, list[str]] = {}
    for n, rec in iter_jsonl(path, error=ModelSpecError):
        tid = rec.get("id", rec.get("instance_id")) if isinstance(rec, dict) else None
        actions = rec.get("actions") if isinstance(rec, dict) else None
        if tid is None or not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            raise ModelSpecError(f'{path}:{n}: expected {{"id": <task id>, "actions": ["<assistant message>", ...]}}')
        out[str(tid)] = actions
    return out


class ScriptedChat:
    """Replays one task's actions as chat replies; past the end it raises EngineError (the script ran out)."""

    def __init__(self, task_id: str, actions: list[str]) -> None:
        self.task_id, self.actions, self.i = task_id, actions, 0

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> ChatReply:
        if self.i >= len(self.actions):
            raise EngineError(f"the script for {self.task_id} has no action left (it has {len(self.actions)})")
        self.i += 1
        return ChatReply(self.actions[self.i - 1])
