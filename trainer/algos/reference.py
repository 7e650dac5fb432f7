"""Slow, obvious per-sequence loop references of the fast kernels, for the tests and ``sao bench algos``.

Plain Python floats, one sequence at a time, written straight from the formulas: nothing clever to get wrong.
"""

from __future__ import annotations

import math

import torch


def skip_observation_gae_row(
    rewards: list[float], values: list[float], mask: list[bool], gamma: float, lam: float, bootstrap_value: float = 0.0
) -> tuple[list[float], list[float]]:
    """One sequence, walked backwards; tokens with ``mask`` False are skipped entirely. ``bootstrap_value``: V of
    the state after the last action token (0 when the episode's return is complete; V there for a cut nothing
    graded)."""
    adv = [0.0] * len(rewards)
    ret = [0.0] * len(rewards)
    next_value = bootstrap_value  # V after the last action token
    lastgaelam = 0.0
    for t in reversed(range(len(rewards))):
        if not mask[t]:
            continue
        delta = rewards[t] + gamma * next_value - values[t]
        lastgaelam = delta + gamma * lam * lastgaelam
        adv[t] = lastgaelam
        ret[t] = lastgaelam + values[t]
        next_value = values[t]
    return adv, ret


def skip_observation_gae_loop(
    rewards: torch.Tensor,
    values: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float,
    lam: float,
    bootstrap_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` in, ``[B, T]`` float64 out: a Python loop over rows and tokens (``bootstrap_values``: ``[B]``)."""
    adv_rows, ret_rows = [], []
    boot = [0.0] * rewards.shape[0] if bootstrap_values is None else bootstrap_values.tolist()
    for r, v, m, c in zip(rewards.tolist(), values.tolist(), action_mask.bool().tolist(), boot, strict=True):
        a, ret = skip_observation_gae_row(r, v, m, gamma, lam, c)
        adv_rows.append(a)
        ret_rows.append(ret)
    shape = tuple(rewards.shape)
    return (
        torch.tensor(adv_rows, dtype=torch.float64).reshape(shape),
        torch.tensor(ret_rows, dtype=torch.float64).reshape(shape),
    )


def grpo_loop(rewards: list[float], group_ids: list[int], eps: float = 1e-6, scale_by_std: bool = True) -> list[float]:
    groups: dict[int, list[float]] = {}
    for r, g in zip(rewards, group_ids, strict=True):
        groups.setdefault(g, []).append(r)
    out = []
    for r, g in zip(rewards, group_ids, strict=True):
        xs = groups[g]
        if len(xs) < 2:
            out.append(0.0)
            continue
        mean = sum(xs) / len(xs)
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
        out.append((r - mean) / (std + eps) if scale_by_std else r - mean)
    return out


def dis_weights_loop(
    logp: list[float], rollout_logp: list[float], mask: list[bool], eps_low: float, eps_high: float
) -> list[float]:
    """Per-token DIS weight ``f(r)``: ``r`` inside ``(1 - eps_low, 1 + eps_high)``, else 0; 0 off the mask."""
    out = []
    for lp, rlp, m in zip(logp, rollout_logp, mask, strict=True):
        r = math.exp(lp - rlp)
        out.append(r if m and 1.0 - eps_low < r < 1.0 + eps_high else 0.0)
    return out


def skip_observation_gae_tensor_loop(
    rewards: torch.Tensor, values: torch.Tensor, action_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same loop written over tensor elements (``values[b, t]``), as a per-sequence trainer loop often is."""
    adv = torch.zeros(rewards.shape, dtype=torch.float64)
    ret = torch.zeros(rewards.shape, dtype=torch.float64)
    for b in range(rewards.shape[0]):
        next_value = 0.0
        lastgaelam = 0.0
        for t in reversed(range(rewards.shape[1])):
            if not action_mask[b, t]:
                continue
            delta = float(rewards[b, t]) + gamma * next_value - float(values[b, t])
            lastgaelam = delta + gamma * lam * lastgaelam
            adv[b, t] = lastgaelam
            ret[b, t] = lastgaelam + float(values[b, t])
            next_value = float(values[b, t])
    return adv, ret
