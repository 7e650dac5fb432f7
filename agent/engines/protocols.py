"""The Engine seam: token ids in, sampled token ids and their logprobs out, versioned weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class EngineError(RuntimeError):
    """The engine failed to answer (server dead, retries exhausted): an infra error for the episode."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one action. ``temperature=0`` is greedy. ``top_k=0`` keeps every token. ``stop`` strings end
    the action early."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_k: int = 0


@dataclass(frozen=True)
class Generation:
    """Sampled tokens, the weights version that produced them, and why sampling stopped ("stop" | "length").

    ``logprobs`` are log-probabilities under the distribution the token was actually drawn from: logits divided by
    the temperature, then top-k / top-p applied and renormalised. What a trainer recomputes (logits / T) equals
    them when top_p = 1 and top_k = 0. Greedy sampling (temperature 0) reports the temperature-1 logprob."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    version: int = 0
    extra: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """A trainable-policy inference engine."""

    @property
    def version(self) -> int: ...

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation: ...

    async def update_weights(self, checkpoint_dir: str, version: int) -> None: ...

    async def close(self) -> None: ...
