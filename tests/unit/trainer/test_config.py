"""Config tree: YAML + dotted overrides, validation errors that name the field and the fix, resume diffs."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import ConfigError, config_diff, config_from_dict, load_config, parse_overrides, save_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_overrides_parse_yaml_scalars() -> None:
    assert parse_overrides(["trainer.lr=1e-5", "run.plot=false", "rollout.action_vocab=[A, B]"]) == [
        ("trainer.lr", "1e-5"),
        ("run.plot", False),
        ("rollout.action_vocab", ["A", "B"]),
    ]
    cfg = config_from_dict({}, ["trainer.lr=1e-5", "trainer.critic_updates_per_step=2", "trainer.lambda=0.9"])
    assert cfg.trainer.lr == pytest.approx(1e-5)
    assert cfg.trainer.critic_updates_per_step == 2
    assert cfg.trainer.lam == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("trainer.critic_updates_per_step=0", "critic_updates_per_step"),
        ("trainer.eps_low=1.5", "eps_low"),
        ("trainer.eps_low=0", "eps_low"),
        ("trainer.algorithm=spo", "did you mean 'sao'"),
        ("trainer.algoritm=sao", "did you mean trainer.algorithm"),
        ("deepspeed.zero_stage=4", "zero_stage"),
        ("trainer.batch_size=two", "trainer.batch_size: expected an integer"),
        ("run.plot=maybe", "run.plot: expected true or false"),
        ("nosuchsection.x=1", "unknown config key 'nosuchsection'"),
        ("rollout.engine=vllm", "action_vocab"),  # toy.yaml restricts the vocabulary, which needs the hf engine
    ],
)
def test_bad_values_name_the_field(override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        load_config(CONFIGS / "toy.yaml", [override])
    assert needle in str(err.value)


def test_grpo_batch_must_hold_whole_groups() -> None:
    with pytest.raises(ConfigError, match="group_size"):
        config_from_dict({"trainer": {"algorithm": "grpo", "batch_size": 6, "group_size": 4}})


@pytest.mark.parametrize("name", ["quickstart.yaml", "toy.yaml", "swe.yaml", "math_tir.yaml"])
def test_shipped_configs_load(name: str) -> None:
    cfg = load_config(CONFIGS / name)
    assert cfg.trainer.algorithm == "sao"


def test_saved_config_round_trips_and_diffs(tmp_path: Path) -> None:
    cfg = load_config(CONFIGS / "toy.yaml")
    save_config(cfg, tmp_path / "c.yaml")
    again = load_config(tmp_path / "c.yaml")
    assert config_diff(cfg, again) == []
    other = load_config(CONFIGS / "toy.yaml", ["trainer.lr=0.5", "run.total_steps=999"])
    assert config_diff(cfg, other) == ["trainer.lr"]  # total_steps may change on resume
