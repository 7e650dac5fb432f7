"""Config tree: YAML + dotted overrides, validation errors that name the field and the fix, resume diffs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sao.core.config import parse_overrides
from sao.trainer.config import ConfigError, config_diff, config_from_dict, load_config, save_config

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


@pytest.mark.parametrize("name", ["quickstart.yaml", "quickstart_levels.yaml", "toy.yaml", "swe.yaml", "math_tir.yaml"])
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


@pytest.mark.parametrize(
    ("trainer", "needle"),
    [
        ({"algorithm": "grpo_dis", "batch_size": 6, "group_size": 4}, "for grpo_dis (it trains on whole groups)"),
        ({"algorithm": "running_mean", "advantage": "gae"}, "needs critic values"),
        ({"algorithm": "sao", "advantage": "grpo"}, "does not roll out in groups"),
        ({"algorithm": "sao", "advantage": "gea"}, "did you mean 'gae'"),
        ({"critic_lam": 1.5}, "trainer.critic_lam"),
        ({"ppo_epochs": 0}, "trainer.ppo_epochs"),
        ({"behavior_weight_cap": 0.5}, "behavior_weight_cap"),
    ],
)
def test_algorithm_spec_checks(trainer: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"trainer": trainer})
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("rollout", "needle"), [({"top_p": 0.9}, "top_p"), ({"top_k": 50}, "top_k"), ({"temperature": 0}, "temperature")]
)
def test_sampling_the_trainer_cannot_recompute_is_refused(rollout: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        config_from_dict({"rollout": rollout})


def test_specs_drive_the_derived_settings() -> None:
    grpo = config_from_dict({"trainer": {"algorithm": "grpo", "batch_size": 8, "group_size": 4}})
    assert (grpo.uses_critic, grpo.algorithm.grouped, grpo.algorithm.synchronous) == (False, True, True)
    assert grpo.algorithm.max_staleness == 0 and grpo.advantage_estimator == "grpo"
    ppo = config_from_dict({"trainer": {"algorithm": "ppo", "advantage": "gae"}})
    assert ppo.uses_critic and ppo.algorithm.old_policy_recompute and ppo.advantage_estimator == "gae"


def test_a_spec_check_runs() -> None:
    from sao.trainer.algos.registry import ALGORITHMS, AlgorithmSpec, register_algorithm

    if "test_even_k" not in ALGORITHMS:
        register_algorithm(
            AlgorithmSpec(
                "test_even_k",
                advantage="skip_obs_gae",
                policy_loss="dis",
                critic=True,
                checks=(lambda c: None if c.trainer.critic_updates_per_step % 2 == 0 else "K must be even",),
            )
        )
    config_from_dict({"trainer": {"algorithm": "test_even_k", "critic_updates_per_step": 2}})
    with pytest.raises(ConfigError, match="'test_even_k': K must be even"):
        config_from_dict({"trainer": {"algorithm": "test_even_k", "critic_updates_per_step": 3}})


@pytest.mark.parametrize("name", ["math_tir.yaml", "swe.yaml"])
def test_multi_turn_configs_use_a_lambda_under_which_skip_observation_gae_matters(name: str) -> None:
    import torch

    from sao.trainer.algos.advantages import gae, skip_observation_gae

    t = load_config(CONFIGS / name).trainer
    assert t.critic_lam == 1.0
    lam = max(1.0 - 1.0 / (t.lambda_alpha * 4), 0.0) if t.length_adaptive_lambda else t.lam  # 4 action tokens
    action = torch.tensor([[0, 1, 1, 0, 0, 1, 1]], dtype=torch.bool)  # P A A O O A A
    response = torch.tensor([[0, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    rewards = torch.tensor([[0, 0, 0, 0, 0, 0, 1.0]])
    values = torch.tensor([[0, 0.2, 0.3, 0.9, 0.1, 0.5, 0.6]])
    skip, _ = skip_observation_gae(rewards, values, action, t.gamma, lam)
    token, _ = gae(rewards, values, response, t.gamma, lam)
    monte_carlo_minus_v = (rewards.flip(1).cumsum(1).flip(1) - values) * action
    assert not torch.allclose(skip, monte_carlo_minus_v), "gamma = lam = 1: every GAE is the MC return minus V"
    assert not torch.allclose(skip[action], token[action]), "skipping observations would change nothing"
