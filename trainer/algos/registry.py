"""Name -> function registries for advantage estimators and policy losses, with one fixed signature each.

The trainer looks algorithms up only through these registries (``get_advantage(cfg.advantage)``), so every
entry of a registry is called the same way:

* advantage estimators: ``fn(inputs: AdvantageInputs) -> (advantages, returns)``, both ``[B, T]`` float tensors,
  zero off the action tokens;
* policy losses: ``fn(inputs: PolicyLossInputs) -> (loss, metrics)``, ``loss`` a scalar tensor that carries the
  gradient, ``metrics`` a dict of detached 0-dim tensors (call ``float()`` on them to log).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import torch

if TYPE_CHECKING:
    from trainer.algos.advantages import RunningMeanBaseline

F = TypeVar("F", bound=Callable[..., object])


class Registry(Generic[F]):
    """A named table of functions; registering a taken name or looking up an unknown one raises ValueError."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def decorator(fn: F) -> F:
            if not name or not isinstance(name, str):
                raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
            if name in self._entries:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered (by {self._entries[name]!r}); pick another name"
                )
            self._entries[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


@dataclass(frozen=True)
class AdvantageInputs:
    """What every advantage estimator receives. Tensors are ``[B, T]`` unless said otherwise.

    ``rewards``: token rewards (the final reward on the last action token, optional per-turn rewards);
    ``action_mask``: 1 on action tokens; ``values``: critic values (estimators with a critic need them);
    ``response_mask``: 1 on every non-prompt token (``gae`` runs over it; defaults to ``action_mask``);
    ``group_ids``: ``[B]`` prompt group of each row (``grpo``); ``baseline``: the trainer's running-mean state
    (``running_mean``, which reads and then updates it); ``seq_ids``: ``[B, T]`` sequence index for packed rows
    (recursions restart at each sequence; ``-1`` on padding), ``None`` for one sequence per row.
    """

    rewards: torch.Tensor
    action_mask: torch.Tensor
    values: torch.Tensor | None = None
    response_mask: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None
    baseline: RunningMeanBaseline | None = None
    seq_ids: torch.Tensor | None = None
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
    micro-batches) instead of this batch's action-token count.
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


AdvantageFn = Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor]]
PolicyLossFn = Callable[[PolicyLossInputs], tuple[torch.Tensor, dict[str, torch.Tensor]]]

ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register ``fn(AdvantageInputs) -> (advantages, returns)`` under ``name``."""
    return ADVANTAGES.register(name)


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register ``fn(PolicyLossInputs) -> (loss, metrics)`` under ``name``."""
    return POLICY_LOSSES.register(name)


def _load_builtins() -> None:
    # The built-in entries register themselves on import; importing here lets a lookup work without the
    # caller having imported the modules first.
    import trainer.algos.advantages
    import trainer.algos.losses  # noqa: F401


def get_advantage(name: str) -> AdvantageFn:
    _load_builtins()
    return ADVANTAGES.get(name)


def get_policy_loss(name: str) -> PolicyLossFn:
    _load_builtins()
    return POLICY_LOSSES.get(name)


def advantage_names() -> list[str]:
    _load_builtins()
    return ADVANTAGES.names()


def policy_loss_names() -> list[str]:
    _load_builtins()
    return POLICY_LOSSES.names()
