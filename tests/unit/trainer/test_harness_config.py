"""``agent.harness`` in the config tree: checked against the env before anything runs, and the trainer's one
episode runner (the training run, the Ray workers, every stage) plays through that harness's player."""

from __future__ import annotations

import pytest

from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.episodes import TokenPlayer
from sao.agent.harness.player import HarnessPlayer
from sao.trainer.config import ConfigError, config_from_dict
from sao.trainer.rollout.runner import episode_runner
from tests.unit.agent.agent_fakes import CharChatMLTokenizer

SWE = {"id": "sao/SWE-v0", "kwargs": {"max_steps": 4}}


def test_a_harness_is_checked_against_the_env_and_the_registry() -> None:
    with pytest.raises(ConfigError, match=r"agent\.harness: harness 'mini_swe_agent' plays sao/SWE-v0 episodes"):
        config_from_dict({"agent": {"harness": "mini_swe_agent"}})  # the default env is the token game
    with pytest.raises(ConfigError, match=r"agent\.harness: unknown harness 'openhands'"):
        config_from_dict({"agent": {"harness": "openhands"}, "env": SWE})
    cfg = config_from_dict({"agent": {"harness": "mini-swe-agent", "config": "swebench"}, "env": SWE})
    assert cfg.agent.harness == "mini-swe-agent" and config_from_dict({}).agent.harness == "sao"


def test_the_trainers_episode_runner_plays_through_the_configured_harness() -> None:
    pytest.importorskip("minisweagent", reason="mini-swe-agent comes with the agents extra")
    rollout = {"max_context_tokens": 4096, "max_tokens": 256, "max_turns": 12, "temperature": 0.9}
    cfg = config_from_dict({"agent": {"harness": "mini_swe_agent"}, "env": SWE, "rollout": rollout})
    engine, tok = ScriptedEngine([[2]]), CharChatMLTokenizer()
    player = episode_runner(cfg, engine, tok).player
    assert isinstance(player, HarnessPlayer) and player.engine is engine and player.tokenizer is tok
    assert (player.agent.max_turns, player.agent.max_action_tokens, player.agent.temperature) == (12, 256, 0.9)
    assert player.harness.describe()["config"] == "swebench_backticks"
    plain = config_from_dict({"env": SWE, "rollout": rollout})
    assert isinstance(episode_runner(plain, engine, tok).player, TokenPlayer)
