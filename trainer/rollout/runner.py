"""The trainer's one episode runner: ``cfg.rollout`` -> ``AgentConfig`` -> a harness's player -> ``EpisodeRunner``.

The player is ``sao.agent.harness.registry.make_player``'s for ``agent.harness``: SAO's own loop (a ``TokenPlayer``)
or an outside agent (mini-swe-agent) behind a gateway in front of the same engine, whose episodes arrive as rows.

Built here for every trainer-side player of episodes: the training run on rank 0 (``trainer.runs.run``), each Ray
rollout worker (``sao.trainer.cluster.ray_backend``) and the stages (``trainer.runs.stages``: collect, eval,
pretrain_value, which pass their own overrides).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sao.agent.engines.protocols import Engine
from sao.agent.episodes import EpisodeRunner, RunnerConfig, env_factory
from sao.agent.harness.registry import PlayerArgs, make_player
from sao.agent.loop import AgentConfig
from sao.trainer.config import Config


def agent_config(cfg: Config, *, temperature: float | None = None) -> AgentConfig:
    """``cfg.rollout``'s episode limits and sampling; ``temperature`` (0.0 included) replaces
    ``rollout.temperature``."""
    r = cfg.rollout
    return AgentConfig(
        max_context_tokens=r.max_context_tokens,
        max_action_tokens=r.max_tokens,
        max_turns=r.max_turns,
        temperature=r.temperature if temperature is None else temperature,
    )


def episode_runner(
    cfg: Config,
    engine: Engine,
    tokenizer: Any,
    *,
    temperature: float | None = None,
    render_check_every: int | None = None,
    concurrency: int | None = None,
    progress: bool = True,
    out_path: str | Path | None = None,
    env_kwargs: dict[str, Any] | None = None,
) -> EpisodeRunner:
    """A runner of ``cfg.env.id`` episodes played by ``engine`` through ``cfg.agent.harness``'s player.

    Unset overrides take the training run's settings: ``temperature``, ``render_check_every`` and
    ``concurrency`` from ``cfg.rollout``; ``env_kwargs`` update ``cfg.env.kwargs``. ``progress``: a progress line
    while ``run`` runs; ``out_path``: each trajectory appended there."""
    r = cfg.rollout
    args = PlayerArgs(
        agent_config(cfg, temperature=temperature),
        engine,
        tokenizer,
        config=cfg.agent.config,
        render_check_every=r.render_check_every if render_check_every is None else render_check_every,
    )
    player = make_player(cfg.agent.harness, args)
    make_env = env_factory(cfg.env.id, {**cfg.env.kwargs, **(env_kwargs or {})})
    conc = r.concurrency if concurrency is None else concurrency
    return EpisodeRunner(make_env, player, RunnerConfig(conc, progress), out_path=out_path)
