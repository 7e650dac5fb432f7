"""The agent's env seam: what an episode needs from an env (async Gymnasium API, typed info) and how it is closed.

Every SAO env (``sao.envs.base.MultiTurnEnv``) satisfies ``AsyncEnv``. ``aend`` is optional: an env that has it grades
what exists when the agent's own limit (context length, turn cap) ends a running episode. ``close_env`` is the one
way an episode's env is released (``aclose``, else ``close``).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Protocol

from sao.envs.protocols import ResetInfo, StepInfo


class AsyncEnv(Protocol):
    """What the episode loop needs from an env."""

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, ResetInfo]:
        """Start an episode: the first user message and ``ResetInfo``."""
        ...

    async def astep(self, action: str) -> tuple[str, float, bool, bool, StepInfo]:
        """One assistant message -> (observation, reward, terminated, truncated, ``StepInfo``)."""
        ...


def env_id_of(env: Any) -> str:
    """The registered id of ``env`` (``sao/Name-v0``), else its class name."""
    spec = getattr(env, "spec", None)
    return str(getattr(spec, "id", None) or type(env).__name__)


async def agent_ended(env: Any, reason: str) -> tuple[float, StepInfo]:
    """Tell a running env that the agent ended the episode (``aend``); (0.0, {}) for envs without it."""
    end = getattr(env, "aend", None)
    if end is None:
        return 0.0, StepInfo()
    reward, info = await end(reason)
    return float(reward), info


async def close_env(env: Any) -> None:
    """Release ``env`` (``aclose`` or ``close``); a failing close never turns a finished episode into an error."""
    if env is None:
        return
    with contextlib.suppress(Exception):
        closer = getattr(env, "aclose", None) or getattr(env, "close", None)
        if closer is not None:
            res = closer()
            if inspect.isawaitable(res):
                await res
