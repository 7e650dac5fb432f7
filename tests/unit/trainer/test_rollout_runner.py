"""The trainer's one episode-runner builder gives each caller its settings: the training run and the Ray workers
take ``cfg.rollout`` as it is, the stages their overrides (a 0.0 temperature included), and a stage plays through it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.episodes import RunnerConfig, TokenPlayer
from sao.agent.loop import AgentConfig
from sao.agent.records import read_jsonl
from sao.trainer.config import config_from_dict
from sao.trainer.rollout.runner import episode_runner
from sao.trainer.runs import stages
from tests.unit.agent.agent_fakes import CharChatMLTokenizer

TOK = CharChatMLTokenizer()


def _cfg() -> Any:
    rollout = {"max_context_tokens": 1000, "max_tokens": 40, "max_turns": 5, "temperature": 0.7,
               "render_check_every": 3, "concurrency": 6}  # fmt: skip
    env = {"id": "sao/TokenGame-v0", "kwargs": {"turns": 2, "symbols": "AB"}}
    return config_from_dict({"rollout": rollout, "env": env, "run": {"progress": False, "seed": 11}})


def test_the_training_run_and_the_ray_workers_take_cfg_rollout_as_it_is() -> None:
    cfg, engine = _cfg(), ScriptedEngine([[2]])
    runner = episode_runner(cfg, engine, TOK)  # trainer.runs.run's _setup and RolloutWorkerImpl pass nothing more
    player = runner.player
    assert isinstance(player, TokenPlayer) and player.engine is engine and player.tokenizer is TOK
    assert player.cfg == AgentConfig(max_context_tokens=1000, max_action_tokens=40, max_turns=5, temperature=0.7)
    assert player.render_check_every == 3
    assert runner.cfg == RunnerConfig(6, progress=True) and runner.out_path is None
    env = runner.env_factory()
    assert (env.turns, env.symbols) == (2, ["A", "B"])


def test_the_stages_overrides_replace_the_training_settings(tmp_path: Path) -> None:
    cfg = _cfg()
    runner = episode_runner(
        cfg, ScriptedEngine([[2]]), TOK, temperature=0.0, render_check_every=0, concurrency=2, progress=False,
        out_path=tmp_path / "t.jsonl", env_kwargs={"turns": 4},
    )  # fmt: skip
    assert isinstance(runner.player, TokenPlayer)
    assert runner.player.cfg.temperature == 0.0, "a 0.0 override is not 'unset'"
    assert runner.player.cfg.max_turns == 5 and runner.player.render_check_every == 0
    assert runner.cfg == RunnerConfig(2, progress=False) and runner.out_path == tmp_path / "t.jsonl"
    env = runner.env_factory()
    assert (env.turns, env.symbols) == (4, ["A", "B"]), "env_kwargs update env.kwargs, they do not replace them"
    assert cfg.env.kwargs == {"turns": 2, "symbols": "AB"}


def test_a_stage_plays_its_episodes_through_the_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append(kw)
        return episode_runner(*args, **kw)

    monkeypatch.setattr(stages, "episode_runner", spy)
    cfg, out = _cfg(), tmp_path / "trajectories.jsonl"
    engine = ScriptedEngine([[*TOK.encode("A"), 2]])
    tasks = [{"id": "a", "sequence": ["A", "B"]}, {"id": "b", "sequence": ["B", "A"]}]
    trajs = asyncio.run(stages._rollouts(cfg, engine, TOK, tasks, out, 3, 0.0, {"turns": 2}))
    assert seen == [{"temperature": 0.0, "render_check_every": 0, "concurrency": 3, "progress": False,
                     "out_path": out, "env_kwargs": {"turns": 2}}]  # fmt: skip
    assert sorted(t.task_id for t in trajs) == ["a", "b"]
    assert sorted(t.task_id for t in read_jsonl(out)) == ["a", "b"]
