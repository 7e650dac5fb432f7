"""One training step on tiny models under single-process DeepSpeed: which parameters move, for every algorithm."""

from __future__ import annotations

import pytest
import torch

from tests.integration.trainer._helpers import synthetic_trajectories
from trainer.config import config_from_dict

pytestmark = [pytest.mark.deepspeed]


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def _changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> set[str]:
    return {k for k, v in module.named_parameters() if not torch.equal(before[k], v.detach())}


def _learner(algorithm: str, kind: str = "moe", **trainer: object):
    from trainer import distributed
    from trainer.learner import Learner
    from trainer.models import load_actor, load_critic

    distributed.init_distributed()
    cfg = config_from_dict(
        {
            "model": {"path": f"tiny:{kind}"},
            "trainer": {"algorithm": algorithm, "batch_size": 4, "lr": 1e-3, "group_size": 2, **trainer},
            "critic": {"lr": 1e-3},
            "deepspeed": {"micro_batch_size": 2},
        }
    )
    actor = load_actor(cfg)
    critic = load_critic(cfg, actor) if cfg.uses_critic else None
    trajs = synthetic_trajectories(actor, 4)
    return Learner(cfg, actor, critic, pad_token_id=0), trajs


def test_sao_step_moves_actor_and_only_non_attention_critic_params(deepspeed_env: dict[str, str]) -> None:
    from trainer.models import attention_param_names

    learner, trajs = _learner("sao", critic_updates_per_step=2)
    critic = learner.critic.module
    attn = set(attention_param_names(critic))
    assert any(".mlp.experts." in n for n in critic.state_dict()), "expected an MoE critic"
    a0, c0 = _snapshot(learner.actor.module), _snapshot(critic)
    metrics = learner.train_step(trajs)
    actor_changed = _changed(a0, learner.actor.module)
    critic_changed = _changed(c0, critic)
    assert actor_changed, "the policy step changed no actor parameter"
    assert critic_changed, "the K critic steps changed no critic parameter"
    assert not (critic_changed & attn), f"frozen attention params moved: {sorted(critic_changed & attn)[:5]}"
    assert "value_head.weight" in critic_changed
    assert any("mlp" in n for n in critic_changed), "no MoE/MLP critic parameter was trained"
    for key in ("value_loss", "explained_variance", "actor_grad_norm", "critic_grad_norm", "mask_frac_low"):
        assert key in metrics


@pytest.mark.parametrize("algorithm", ["grpo", "grpo_dis", "ppo", "running_mean"])
def test_every_algorithm_updates_the_actor(deepspeed_env: dict[str, str], algorithm: str) -> None:
    learner, trajs = _learner(algorithm, kind="llama")
    a0 = _snapshot(learner.actor.module)
    metrics = learner.train_step(trajs)
    assert _changed(a0, learner.actor.module), f"{algorithm}: actor unchanged after one update"
    assert (learner.critic is not None) == (algorithm == "ppo")
    assert metrics["trained_tokens"] == 4 * 6
