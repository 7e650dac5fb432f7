"""Registers the SAO envs with Gymnasium under ``sao/`` (lazy entry points) and lists them for ``sao envs list``.

Importing ``envs`` runs this module: it only records ids and ``"module:Class"`` strings, so it imports no env code.
New envs register the same way with ``register_env`` (see docs/register_env.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium

NAMESPACE = "sao"

_DESCRIPTIONS: dict[str, str] = {}


def register_env(
    env_id: str,
    entry_point: str | Callable[..., gymnasium.Env[Any, Any]],
    description: str,
    *,
    nondeterministic: bool = False,
    **kwargs: Any,
) -> None:
    """Register ``env_id`` (``"sao/Name-v0"``); ``kwargs`` become the constructor's defaults.

    ``entry_point`` is ``"module:Class"`` (imported only at ``gymnasium.make``: registration stays cheap) or the
    class itself.
    Registering an id again replaces it (so re-importing a module that registers is harmless).
    """
    if gymnasium.registry.get(env_id) is not None:
        del gymnasium.registry[env_id]
    gymnasium.register(id=env_id, entry_point=entry_point, nondeterministic=nondeterministic, kwargs=kwargs)
    _DESCRIPTIONS[env_id] = description.strip().splitlines()[0] if description.strip() else ""


def list_envs() -> list[tuple[str, str]]:
    """``(id, one-line description)`` for every env registered under ``sao/``, sorted by id."""
    out = []
    for env_id, spec in gymnasium.registry.items():
        if spec.namespace == NAMESPACE:
            out.append((env_id, _DESCRIPTIONS.get(env_id, f"entry point {spec.entry_point}")))
    return sorted(out)


def _register_builtins() -> None:
    register_env(
        "sao/PythonTool-v0",
        "envs.python_tool:PythonToolEnv",
        "Math problems solved with a sandboxed notebook-like python tool, graded by math-verify on the last \\boxed{}.",
        # Tool timings in info and sandbox wall clocks differ between identical runs.
        nondeterministic=True,
    )
    register_env(
        "sao/OnlineWriting-v0",
        "envs.online_writing:OnlineWritingEnv",
        "Short writing tasks scored by a deterministic style judge whose preferred style shifts every N episodes.",
        # The judge's style depends on a shared episode counter, not only on the seed.
        nondeterministic=True,
    )
    register_env(
        "sao/TokenGame-v0",
        "envs.token_game:TokenGameEnv",
        "Toy multi-turn game: answer each turn with the symbol the shown one determines (learning tests).",
    )
    register_env(
        "sao/SWE-v0",
        "envs.swe.env:SWEEnv",
        "SWE-bench-format repo repair in a Docker sandbox (bash, editor, submit), graded by the swebench harness.",
        nondeterministic=True,
    )


_register_builtins()
