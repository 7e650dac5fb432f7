"""``check_envs``: Gymnasium's ``check_env`` over the registered envs, plugins' included (``sao envs check``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import gymnasium
from gymnasium.utils.env_checker import check_env

from sao.envs.registration import list_envs, load_plugin_envs, resolve_env_id

#: envs the checker skips unless named explicitly, with the reason.
NEEDS_SETUP = {"sao/SWE-v0": "needs an SWE task and Docker; name it with its kwargs to check it"}


@dataclass(frozen=True)
class CheckResult:
    env_id: str
    status: str  # "ok" | "failed" | "skipped"
    message: str
    seconds: float


def check_envs(ids: list[str] | None = None, kwargs: dict[str, Any] | None = None) -> list[CheckResult]:
    """Run ``check_env`` on ``ids`` (default: every env ``list_envs`` shows; ``"module:sao/Name-v0"`` imports
    ``module`` first); ``kwargs`` go to ``gymnasium.make``."""
    load_plugin_envs()
    explicit = ids is not None
    targets = ids if ids is not None else [env_id for env_id, _ in list_envs()]
    out = []
    for env_id in targets:
        if not explicit and env_id in NEEDS_SETUP:
            out.append(CheckResult(env_id, "skipped", NEEDS_SETUP[env_id], 0.0))
            continue
        t0 = time.monotonic()
        env = None
        try:
            env = gymnasium.make(resolve_env_id(env_id), **(kwargs or {}))
            check_env(env.unwrapped, skip_render_check=True)
            out.append(CheckResult(env_id, "ok", "passed gymnasium check_env", time.monotonic() - t0))
        except Exception as e:
            out.append(CheckResult(env_id, "failed", f"{type(e).__name__}: {e}", time.monotonic() - t0))
        finally:
            if env is not None:
                env.close()
    return out
