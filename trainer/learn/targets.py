"""A batch's GAE inputs and critic targets under the one rule for the end of an episode, for RL and value pretraining.

The rule (``Trajectory.bootstraps``): an episode whose return is complete (terminated, a cut the env graded, an
ending the policy caused) takes V = 0 after its last action token; only a cut nothing graded bootstraps, from the
critic's value of the state after the row's last token (its output at the last action token, or at the last
observation token when one follows the last action). The learner and value pretraining both build their inputs
here, so the critic is pretrained on the targets RL then trains it on.

Both states a bootstrap reads are states the critic loss trains (``critic_mask``, ``critic_returns``): the state
before an action (the output at the token before each action token: every action token's shifted value) and the
state after a turn's action (the output at its last action token: the shifted value at the first token after the
action run), whose target is the return of the row's next action token, or the value after the row when no action
follows (0 where the return is complete). So a cut after an action reads a kind of output every turn of every row
trains, not one no loss ever reached.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sao.trainer.algos.registry import AdvantageFn, AdvantageInputs
from sao.trainer.learn.batch import Batch


def value_after(raw_values: torch.Tensor, b: Batch, value_range: Sequence[float] | None = None) -> torch.Tensor:
    """``[B]``: for rows that bootstrap (``b.bootstrap``), the critic's value of the state after the row's last
    token, i.e. its raw (unshifted) output at that token (clamped to ``value_range``, ``critic.value_range``, where
    given); 0 on every other row. ``raw_values``: ``[B, T]`` critic outputs before ``shifted_values`` (the shifted
    tensor has no column for the state after the last token)."""
    last = (b.attention_mask.sum(dim=1) - 1).clamp(min=0).to(raw_values.device)
    v = in_range(raw_values.detach().gather(1, last[:, None]).squeeze(1), value_range)
    return torch.where(b.bootstrap.to(v.device), v, torch.zeros_like(v))


def in_range(values: torch.Tensor, value_range: Sequence[float] | None) -> torch.Tensor:
    """``values`` clamped to ``value_range`` (``critic.value_range``: the returns' range); as they are where None."""
    return values if value_range is None else values.clamp(value_range[0], value_range[1])


def after_action(b: Batch) -> torch.Tensor:
    """``[B, T]`` bool: the first token after each run of action tokens, where the shifted critic value is the output
    at the turn's last action token (the state after the action)."""
    a = b.action_mask
    out = torch.zeros_like(a)
    out[:, 1:] = a[:, :-1] & ~a[:, 1:] & b.attention_mask[:, 1:].bool()
    return out


def critic_mask(b: Batch) -> torch.Tensor:
    """``[B, T]`` bool: the shifted values the critic loss trains: every action token (the state before it) and the
    state after each turn's action (``after_action``)."""
    return b.action_mask | after_action(b)


def turn_start(b: Batch) -> torch.Tensor:
    """``[B, T]`` bool: the first token of each run of action tokens, whose shifted value is the state where the
    turn begins (after the prompt or an observation: what the policy decides the turn from)."""
    a = b.action_mask
    out = a.clone()
    out[:, 1:] = a[:, 1:] & ~a[:, :-1]
    return out


def value_mask(b: Batch, positions: str = "token") -> torch.Tensor:
    """``[B, T]`` bool: the shifted values the critic loss trains under ``critic.value_positions``: ``token``
    (``critic_mask``) or ``turn`` (each turn's start and the state after its action, both states a bootstrap or the
    next turn reads)."""
    if positions == "token":
        return critic_mask(b)
    if positions == "turn":
        return turn_start(b) | after_action(b)
    raise ValueError(f"critic.value_positions: unknown {positions!r}; use token or turn")


def turn_values(values: torch.Tensor, b: Batch) -> torch.Tensor:
    """``values`` (``[B, T]`` shifted) with every action token's value replaced by its turn start's (``turn``
    positions: one value per turn, so every token of a turn is credited against the state it was decided from);
    positions outside the actions keep theirs."""
    a = b.action_mask.to(values.device)
    start = turn_start(b).to(values.device)
    pos = torch.arange(a.shape[1], device=values.device).expand_as(a)
    last_start = torch.cummax(torch.where(start, pos, 0), dim=1).values
    return torch.where(a, values.gather(1, last_start), values)


def values_as_read(
    values: torch.Tensor, b: Batch, positions: str = "token", value_range: Sequence[float] | None = None
) -> torch.Tensor:
    """The shifted values as the advantages read them under ``critic.value_positions``: as they are (``token``) or
    each action token at its turn start's (``turn``, ``turn_values``); on the response tokens clamped to
    ``value_range`` (``critic.value_range``) where given, the rest left as it is."""
    v = turn_values(values, b) if positions == "turn" else values
    return v if value_range is None else torch.where(b.response_mask.to(v.device), in_range(v, value_range), v)


def critic_returns(b: Batch, returns: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``returns`` (``[B, T]``, the estimator's, on action tokens) with the after-action positions filled: the
    return of the row's next action token (the first of the next turn), or ``after`` (``value_after``: 0 where the
    return is complete) where no action follows. Observations carry no reward and skip-observation GAE steps over
    them, so the value after an action is the value before the next one."""
    a = b.action_mask
    width = a.shape[1]
    pos = torch.arange(width, device=a.device).expand_as(a)
    # the index of the first action token at or after each position (``width``: none)
    nxt = torch.flip(torch.cummin(torch.flip(torch.where(a, pos, width), [1]), dim=1).values, [1])
    padded = torch.cat([returns, after.to(returns)[:, None]], dim=1)
    return torch.where(after_action(b), padded.gather(1, nxt), returns)


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
