"""The training tasks a config names (``env.tasks``), for ``sao train``'s task source and the staged runs."""

from __future__ import annotations

from typing import Any

from sao.trainer.config import Config, ConfigError


def load_env_tasks(cfg: Config) -> list[dict[str, Any]] | None:
    """The records of ``env.tasks`` (``cfg.env.num_tasks`` generated from ``run.seed`` for a generator such as
    ``arithmetic``); None when the env brings its own tasks. A bad source raises ``ConfigError`` naming the field."""
    src = cfg.env.tasks
    if src is None:
        return None
    from sao.envs.datasets import load_tasks

    try:
        return load_tasks(src, num_generated=cfg.env.num_tasks, seed=cfg.run.seed)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(
            f"env.tasks: {e}; or 'arithmetic', 'arithmetic_chain', or null for the env's own tasks"
        ) from e
