"""``LatencyEnv`` (``sao/Latency-v0``): any SAO text env with a heavy-tailed (lognormal) wait added to every turn.

Why: the throughput benchmark needs the shape of real agent workloads (tool calls and test runs whose duration
has a long tail) on a toy env that costs no CPU. The wait is an ``asyncio.sleep`` inside ``take_turn``, so it
occupies an episode slot like a sandbox command would, without competing with the trainer for the cores.

Per-turn latency ``L = median_s * exp(sigma * Z)`` with ``Z ~ N(0, 1)`` (a lognormal whose median is
``median_s``; mean ``median_s * exp(sigma^2 / 2)``), capped at ``max_s``. ``reset_s`` adds a fixed wait at the
start of each episode (container start). Draws come from the env's seeded generator, so a seeded reset replays
the same waits. The inner env is built with ``gymnasium.make(inner_id, **inner_kwargs)`` and every hook is
delegated to it: rewards, info and limits are the inner env's. ``info["latency_s"]`` carries each step's wait.

Registered on import of this module (benchmarks sit above envs, so ``envs`` cannot register it); a config can
name it without importing anything first as ``env.id: "sao.benchmarks.latency_env:sao/Latency-v0"``.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import gymnasium
import numpy as np

from sao.envs.base import MultiTurnEnv, Turn
from sao.envs.registration import register_env

ENV_ID = "sao/Latency-v0"


def lognormal_stats(median_s: float, sigma: float) -> dict[str, float]:
    """Mean, p50, p90 and p99 of one per-turn wait (uncapped), for reports."""
    z = {"p50": 0.0, "p90": 1.2815515655446004, "p99": 2.3263478740408408}
    out = {"mean": median_s * math.exp(sigma * sigma / 2)}
    out.update({k: median_s * math.exp(sigma * v) for k, v in z.items()})
    return out


class LatencyEnv(MultiTurnEnv):
    """Delegates to an inner SAO env and sleeps a lognormal time before each turn's result (see module doc)."""

    def __init__(
        self,
        inner_id: str = "sao/TokenGame-v0",
        inner_kwargs: dict[str, Any] | None = None,
        median_s: float = 0.1,
        sigma: float = 1.0,
        max_s: float = 30.0,
        reset_s: float = 0.0,
    ) -> None:
        if median_s < 0 or sigma < 0 or max_s < 0 or reset_s < 0:
            raise ValueError(
                f"LatencyEnv needs median_s, sigma, max_s, reset_s >= 0, got {median_s}, {sigma}, {max_s}, {reset_s}"
            )
        import sao.envs  # noqa: F401 - registers the built-in sao/ envs the inner id may name

        inner = gymnasium.make(inner_id, **(inner_kwargs or {})).unwrapped
        if not isinstance(inner, MultiTurnEnv):
            raise ValueError(f"LatencyEnv wraps SAO text envs (MultiTurnEnv); {inner_id!r} is {type(inner).__name__}")
        self.inner: MultiTurnEnv = inner
        super().__init__(
            max_steps=inner.max_steps,
            max_wall_s=inner.max_wall_s + 100 * max_s,  # the waits must not turn into time-limit truncations
            max_format_errors=inner.max_format_errors,
            max_obs_chars=inner.max_obs_chars,
        )
        self.action_space = inner.action_space
        self.median_s, self.sigma, self.max_s, self.reset_s = float(median_s), float(sigma), float(max_s), reset_s

    def draw(self) -> float:
        """One per-turn wait from the env's seeded generator."""
        z = float(self.np_random.standard_normal())
        return min(self.median_s * math.exp(self.sigma * z), self.max_s)

    def sample_task(self, rng: np.random.Generator) -> Any:
        return self.inner.sample_task(rng)

    def system_prompt(self) -> str:
        return self.inner.system_prompt()

    def tool_schemas(self) -> list[dict[str, Any]]:
        return self.inner.tool_schemas()

    async def start_episode(self, task: Any) -> tuple[str, dict[str, Any]]:
        if self.reset_s:
            await asyncio.sleep(self.reset_s)
        return await self.inner.start_episode(task)

    async def take_turn(self, action: str) -> Turn:
        wait = self.draw()
        await asyncio.sleep(wait)
        turn = await self.inner.take_turn(action)
        turn.info["latency_s"] = wait
        return turn

    async def end_episode(self) -> None:
        await self.inner.end_episode()

    async def aclose(self) -> None:
        await super().aclose()
        await self.inner.aclose()


register_env(
    ENV_ID,
    "sao.benchmarks.latency_env:LatencyEnv",
    "Any SAO text env with a lognormal (heavy-tailed) wait per turn: the throughput benchmark's workload.",
    nondeterministic=True,
)
