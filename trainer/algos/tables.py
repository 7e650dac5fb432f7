"""The registry tables and what their entries receive, one layer under the entries and the lookups.

``sao.trainer.algos.advantages``, ``losses`` and ``algorithms`` register into these tables on import (the
``register_advantage`` / ``register_policy_loss`` decorators, ``ALGORITHMS.add``); ``sao.trainer.algos.registry`` reads
them and imports the built-in entries before a lookup. Callers import everything from ``sao.trainer.algos.registry``.

This module imports no torch at run time, so reading a config stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sao.core.registry import Registry

if TYPE_CHECKING:
    import torch

    from sao.trainer.algos.advantages import RunningMeanBaseline


@dataclass(frozen=True)
class AdvantageInputs:
    """What every advantage estimator receives. Tensors are ``[B, T]`` unless said otherwise.

    ``rewards``: token rewards (the final reward on the last action token, optional per-turn rewards);
    ``action_mask``: 1 on action tokens; ``values``: critic values (estimators with a critic need them);
    ``response_mask``: 1 on every non-prompt token (``gae`` runs over it; defaults to ``action_mask``);
    ``group_ids``: ``[B]`` prompt group of each row (``grpo``); ``episode_ids``: ``[B]`` episode of each row (the rows
    of an episode share its outcome; ``grpo`` and ``running_mean`` count each episode once; None: one row each);
    ``baseline``: the trainer's running-mean state (``running_mean``, which reads and then updates it);
    ``baseline_keys``: ``[B]`` the key of each row's running mean (``trainer.baseline_key``, e.g. the episode's level;
    None: one mean for all rows); ``bootstrap_values``: ``[B]``, V of the state after each
    row's last token where the episode's return is incomplete (a cut nothing graded: ``Trajectory.bootstraps``)
    and 0 where it is complete; estimators with a critic take it as V after the row's last token (None: 0 for all).
    """

    rewards: torch.Tensor
    action_mask: torch.Tensor
    values: torch.Tensor | None = None
    response_mask: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None
    episode_ids: torch.Tensor | None = None
    baseline: RunningMeanBaseline | None = None
    baseline_keys: tuple[str, ...] | None = None
    bootstrap_values: torch.Tensor | None = None
    gamma: float = 1.0
    lam: float = 1.0


@dataclass(frozen=True)
class PolicyLossInputs:
    """What every policy loss receives. Tensors are ``[B, T]`` (``logits`` ``[B, T, V]``).

    ``logp``: current-policy logprob of each token (carries the gradient); ``rollout_logp``: the engine's logprob
    while sampling; ``old_logp``: a no-grad recompute with the pre-update weights (PPO-style losses need it);
    ``logits``: optional, only for the entropy metric; ``eps_low``/``eps_high``: the lower/upper trust-region
    widths; ``behavior_weight_cap``: ``decoupled_ppo`` drops tokens whose ``pi_old / pi_rollout`` exceeds it;
    ``normalizer``: divide the token sum by this (e.g. the global action-token count over gradient-accumulation
    micro-batches) instead of this batch's action-token count; ``entropy``: per-token entropy (carrying its
    gradient) for an entropy bonus of weight ``entropy_coef``, applied only on the tokens the loss trains (a
    token DIS masks out gets no gradient at all).
    """

    logp: torch.Tensor
    rollout_logp: torch.Tensor
    advantages: torch.Tensor
    action_mask: torch.Tensor
    old_logp: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    eps_low: float = 0.2
    eps_high: float = 0.28
    behavior_weight_cap: float | None = None
    normalizer: float | None = None
    entropy: torch.Tensor | None = None
    entropy_coef: float = 0.0


AdvantageFn = Callable[[AdvantageInputs], "tuple[torch.Tensor, torch.Tensor]"]
PolicyLossFn = Callable[[PolicyLossInputs], "tuple[torch.Tensor, dict[str, torch.Tensor]]"]


@dataclass(frozen=True)
class AdvantageTraits:
    """The inputs an advantage estimator reads, which the learner fills in and config validation checks:
    ``needs_values`` critic values (only algorithms with a critic; and an algorithm with a critic must use such an
    estimator, else the critic trains for nothing), ``needs_groups`` rollouts in prompt groups, ``needs_baseline``
    the trainer's running-mean state; ``token_level``: it covers observation tokens too (the critic then learns
    values on every response token)."""

    needs_values: bool = False
    needs_groups: bool = False
    token_level: bool = False
    needs_baseline: bool = False


@dataclass(frozen=True)
class PolicyLossTraits:
    """What a policy loss needs: ``needs_old_logp`` a no-grad recompute with the pre-update weights (the algorithm
    must declare ``old_policy_recompute``); ``dis_band`` its ratio bounds are the DIS band (``trainer.dis_band``)
    rather than the PPO trust region (``trainer.eps_low`` / ``eps_high``); ``entropy_bonus`` it applies
    ``PolicyLossInputs.entropy`` itself, on the tokens it trains (for a loss that does not, the learner adds the
    bonus over every action token)."""

    needs_old_logp: bool = False
    dis_band: bool = False
    entropy_bonus: bool = False


ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")
ADVANTAGE_TRAITS: dict[str, AdvantageTraits] = {}
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
POLICY_LOSS_TRAITS: dict[str, PolicyLossTraits] = {}


def register_advantage(
    name: str,
    *,
    needs_values: bool = False,
    needs_groups: bool = False,
    token_level: bool = False,
    needs_baseline: bool = False,
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register ``fn(AdvantageInputs) -> (advantages, returns)`` under ``name``, with its traits
    (``AdvantageTraits``: which ``AdvantageInputs`` it reads). Config validation checks them against the algorithm.
    """

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        ADVANTAGES.add(name, fn)
        ADVANTAGE_TRAITS[name] = AdvantageTraits(needs_values, needs_groups, token_level, needs_baseline)
        return fn

    return decorator


def register_policy_loss(
    name: str, *, needs_old_logp: bool = False, dis_band: bool = False, entropy_bonus: bool = False
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register ``fn(PolicyLossInputs) -> (loss, metrics)`` under ``name``, with its traits
    (``PolicyLossTraits``)."""

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES.add(name, fn)
        POLICY_LOSS_TRAITS[name] = PolicyLossTraits(needs_old_logp, dis_band, entropy_bonus)
        return fn

    return decorator


@dataclass(frozen=True)
class AlgorithmSpec:
    """One ``trainer.algorithm``: everything the config checks, the learner and the run branch on.

    ``advantage`` / ``policy_loss``: names in the estimator and loss registries (``trainer.advantage`` may
    override the estimator for an ablation); ``critic``: train a value model (K steps per policy step);
    ``old_policy_recompute``: a no-grad forward with the pre-update weights before the policy step(s), for losses
    that clip against the proximal policy; ``grouped``: every prompt is rolled out ``trainer.group_size`` times and
    a batch holds whole groups; ``synchronous``: a batch's episodes start only after the previous batch was
    trained and synced (on-policy); ``max_staleness``: None keeps ``trainer.max_staleness``, a number overrides it
    (0 = on-policy); ``critic_warmup``: ``trainer.critic_warmup_steps`` may train the critic alone on the first
    batches (needs ``critic``); ``defaults``: ``(trainer field, value)`` pairs that fill trainer fields left null
    (e.g. ppo's epochs, without which its clip is inert); ``checks``: extra config checks, each
    ``fn(cfg) -> error message or None``.
    """

    name: str
    advantage: str
    policy_loss: str
    critic: bool
    old_policy_recompute: bool = False
    grouped: bool = False
    synchronous: bool = False
    max_staleness: int | None = None
    critic_warmup: bool = False
    summary: str = ""
    defaults: tuple[tuple[str, Any], ...] = ()
    checks: tuple[Callable[[Any], str | None], ...] = ()


ALGORITHMS: Registry[AlgorithmSpec] = Registry("training algorithm")


__all__ = [
    "ADVANTAGES",
    "ADVANTAGE_TRAITS",
    "ALGORITHMS",
    "POLICY_LOSSES",
    "POLICY_LOSS_TRAITS",
    "AdvantageFn",
    "AdvantageInputs",
    "AdvantageTraits",
    "AlgorithmSpec",
    "PolicyLossFn",
    "PolicyLossInputs",
    "PolicyLossTraits",
    "Registry",
    "register_advantage",
    "register_policy_loss",
]
