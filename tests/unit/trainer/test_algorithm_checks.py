"""Combinations the registry cannot run are refused when the config loads, before any model is built."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sao.trainer.config import ConfigError, config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[3]


def test_running_mean_estimator_under_a_critic_algorithm_is_refused_at_load() -> None:
    # issue 22 item 4: this passed validation and died at the first step, after the models were built
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs" / "toy.yaml", ["trainer.advantage=running_mean"])
    msg = str(err.value)
    assert "trainer.advantage" in msg and "trainer.algorithm=running_mean" in msg


def test_ppo_defaults_are_not_inert() -> None:
    # issue 23 defect 7: one epoch clips against a recompute of the same weights (ratio exactly 1)
    ppo = config_from_dict({"trainer": {"algorithm": "ppo"}})
    assert ppo.trainer.ppo_epochs == 2 and ppo.trainer.behavior_weight_cap == 2.0
    explicit = config_from_dict({"trainer": {"algorithm": "ppo", "ppo_epochs": 3, "behavior_weight_cap": math.inf}})
    assert explicit.trainer.ppo_epochs == 3 and explicit.trainer.behavior_weight_cap == math.inf
    assert config_from_dict({"trainer": {"algorithm": "sao"}}).trainer.ppo_epochs == 1


def test_staleness_and_update_order_fields() -> None:
    cfg = config_from_dict({})
    assert cfg.trainer.staleness_policy == "wait" and cfg.trainer.update_order == "advantages_first"
    with pytest.raises(ConfigError, match=r"trainer\.staleness_policy"):
        config_from_dict({"trainer": {"staleness_policy": "skip"}})
    with pytest.raises(ConfigError, match=r"trainer\.update_order"):
        config_from_dict({"trainer": {"update_order": "random"}})
    with pytest.raises(ConfigError, match="staleness_policy=drop"):
        config_from_dict({"trainer": {"max_staleness": 0}})
    assert config_from_dict({"trainer": {"max_staleness": 0, "staleness_policy": "drop"}}).trainer.max_staleness == 0
