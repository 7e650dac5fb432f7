"""ScriptedEngine: replays fixed actions (token ids with logprobs) in order; for loop tests and dry runs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agent.engines.protocols import EngineError, Generation, SamplingParams


class ScriptedEngine:
    """Returns ``outputs[i]`` on the i-th call (cut at ``max_tokens``); ``fail_after`` raises EngineError."""

    def __init__(
        self,
        outputs: Sequence[Sequence[int]],
        *,
        logprob: float = -0.5,
        version: int = 0,
        delay_s: float = 0.0,
        fail_after: int | None = None,
    ) -> None:
        self.outputs = [list(o) for o in outputs]
        self.logprob, self._version, self.delay_s, self.fail_after = logprob, version, delay_s, fail_after
        self.prompts: list[list[int]] = []

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        n = len(self.prompts)
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
