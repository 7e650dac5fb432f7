"""The built-in training algorithms (``trainer.algorithm``): SAO and the baselines for the ablation, as specs."""

from __future__ import annotations

from sao.trainer.algos.tables import ALGORITHMS, AlgorithmSpec

BUILTIN = (
    AlgorithmSpec(
        "sao",
        advantage="skip_obs_gae",
        policy_loss="dis",
        critic=True,
        critic_warmup=True,
        summary="single rollout, asynchronous, DIS against the engine's logprobs, critic with K steps",
    ),
    AlgorithmSpec(
        "ppo",
        advantage="skip_obs_gae",
        policy_loss="decoupled_ppo",
        critic=True,
        old_policy_recompute=True,
        critic_warmup=True,
        summary="VAPO-style: critic, clip against an old-policy recompute, capped behaviour weight",
        # one epoch would clip against a recompute of the same weights (ratio exactly 1: the clip never acts)
        defaults=(("ppo_epochs", 2), ("behavior_weight_cap", 2.0)),
    ),
    AlgorithmSpec(
        "grpo",
        advantage="grpo",
        policy_loss="ppo_clip",
        critic=False,
        old_policy_recompute=True,
        grouped=True,
        synchronous=True,
        max_staleness=0,
        summary="groups of trainer.group_size rollouts, group-normalised outcome, PPO clip, on-policy",
    ),
    AlgorithmSpec(
        "grpo_dis",
        advantage="grpo",
        policy_loss="dis",
        critic=False,
        grouped=True,
        summary="GRPO's group advantage with SAO's asynchrony and DIS loss",
    ),
    AlgorithmSpec(
        "running_mean",
        advantage="running_mean",
        policy_loss="dis",
        critic=False,
        summary="single rollout, a running-mean reward baseline instead of a critic, DIS loss",
    ),
)

for _spec in BUILTIN:
    if _spec.name not in ALGORITHMS:
        ALGORITHMS.add(_spec.name, _spec)
