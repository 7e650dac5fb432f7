"""A batch's GAE inputs and critic targets under the one rule for the end of an episode, for RL and value pretraining.

The rule (``Trajectory.bootstraps``): an episode whose return is complete (terminated, a cut the env graded, an
ending the policy caused) takes V = 0 after its last action token; only a cut nothing graded bootstraps, from the
critic's value of the state after the row's last token (its output at the last action token, or at the last
observation token when one follows the last action). The learner and value pretraining both build their inputs
here, so the critic is pretrained on the targets RL then trains it on.
"""

from __future__ import annotations

import torch

from sao.trainer.algos.registry import AdvantageFn, AdvantageInputs
from sao.trainer.learn.batch import Batch


def value_after(raw_values: torch.Tensor, b: Batch) -> torch.Tensor:
    """``[B]``: for rows that bootstrap (``b.bootstrap``), the critic's value of the state after the row's last
    token, i.e. its raw (unshifted) output at that token; 0 on every other row. ``raw_values``: ``[B, T]`` critic
    outputs before ``shifted_values`` (the shifted tensor has no column for the state after the last token)."""
    last = (b.attention_mask.sum(dim=1) - 1).clamp(min=0).to(raw_values.device)
    v = raw_values.detach().gather(1, last[:, None]).squeeze(1)
    return torch.where(b.bootstrap.to(v.device), v, torch.zeros_like(v))


def gae_inputs(b: Batch, values: torch.Tensor, after: torch.Tensor, gamma: float, lam: float) -> AdvantageInputs:
    """The estimator's inputs for batch ``b``: ``values`` the shifted critic values (``[B, T]``), ``after`` the
    ``value_after`` of the rows (``[B]``, 0 where the return is complete)."""
    return AdvantageInputs(
        rewards=b.rewards,
        action_mask=b.action_mask,
        response_mask=b.response_mask,
        values=values,
        bootstrap_values=after,
        gamma=gamma,
        lam=lam,
    )


def value_targets(
    fn: AdvantageFn, b: Batch, values: torch.Tensor, after: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """The critic's targets (``[B, T]`` returns of estimator ``fn`` at ``lam``). Value pretraining calls it with
    zero ``values`` and ``lam = 1``: the discounted reward-to-go plus, on a row that bootstraps, the discounted
    value after its last token, which is exactly what RL's critic targets are at ``trainer.critic_lam = 1``."""
    return fn(gae_inputs(b, values, after, gamma, lam))[1]
