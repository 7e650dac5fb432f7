"""Policy and value losses: DIS (SAO), PPO-clip, decoupled PPO, clipped value MSE, explained variance.

All tensors are ``[B, T]`` (``logits`` ``[B, T, V]``, position ``t`` being the distribution that produced token
``t``). Losses are token-means over the action tokens of the whole batch (or ``sum / normalizer`` when the
trainer passes a global token count for gradient accumulation) and return ``(loss, metrics)``: ``loss`` carries
the gradient, ``metrics`` are detached 0-dim tensors (``float()`` them to log).
"""

from __future__ import annotations

import math

import torch

from sao.trainer.algos.tables import PolicyLossInputs, register_policy_loss

Metrics = dict[str, torch.Tensor]


def _check_shapes(**tensors: torch.Tensor) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        raise ValueError(f"expected [B, T] tensors of one shape, got {shapes}")


def _check_finite(mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    for name, x in tensors.items():
        if not bool(torch.isfinite(x[mask]).all()):
            raise ValueError(
                f"{name} has NaN/inf on action tokens; check the model forward (dtype overflow?) and, for rollout "
                "logprobs, the engine's output"
            )


def _check_eps(eps_low: float, eps_high: float) -> None:
    if not (0.0 < eps_low <= 1.0):
        raise ValueError(f"eps_low must be in (0, 1] (the lower bound 1 - eps_low must be >= 0), got {eps_low!r}")
    if math.isnan(eps_high) or not eps_high > 0.0:
        raise ValueError(f"eps_high must be > 0, got {eps_high!r}")


def _denominator(mask: torch.Tensor, normalizer: float | None) -> torch.Tensor:
    if normalizer is not None:
        if not normalizer > 0:
            raise ValueError(f"loss normalizer must be > 0, got {normalizer!r}")
        return torch.tensor(float(normalizer), device=mask.device)
    return mask.sum().clamp(min=1).float()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ``mask``; 0 when the mask is empty."""
    m = mask.bool()
    return torch.where(m, x, torch.zeros_like(x)).sum() / m.sum().clamp(min=1)


@torch.no_grad()
def entropy_from_logits(logits: torch.Tensor, mask: torch.Tensor, chunk_tokens: int = 1024) -> torch.Tensor:
    """Mean token entropy over ``mask`` without materialising a ``[B, T, V]`` float32 copy.

    Only masked positions are read, ``chunk_tokens`` rows of ``V`` at a time, so the extra memory is
    ``chunk_tokens * V`` floats whatever ``B * T``.
    """
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(mask.shape):
        raise ValueError(f"logits must be [B, T, V] matching the mask {tuple(mask.shape)}, got {tuple(logits.shape)}")
    flat = logits.reshape(-1, logits.shape[-1])
    idx = mask.reshape(-1).bool().nonzero().squeeze(1)
    total = torch.zeros((), dtype=torch.float64, device=logits.device)
    for s in range(0, idx.numel(), chunk_tokens):
        rows = flat[idx[s : s + chunk_tokens]].float()
        logz = torch.logsumexp(rows, dim=-1)
        p = torch.softmax(rows, dim=-1)
        total += (logz - (p * rows).sum(-1)).double().sum()
    return (total / max(idx.numel(), 1)).float()


def _entropy_bonus(
    entropy: torch.Tensor | None, coef: float, live: torch.Tensor, mask: torch.Tensor, normalizer: float | None
) -> torch.Tensor | float:
    """``coef * sum(entropy over the trained tokens) / N``, N the loss's own denominator: a token the loss masks
    out (outside the DIS band, over the behaviour-weight cap) gets no gradient from the bonus either."""
    if entropy is None or not coef:
        return 0.0
    if tuple(entropy.shape) != tuple(mask.shape):
        raise ValueError(f"entropy must be [B, T] like the action mask {tuple(mask.shape)}, got {tuple(entropy.shape)}")
    return coef * torch.where(live, entropy, torch.zeros_like(entropy)).sum() / _denominator(mask, normalizer)


def _ratio_metrics(ratio: torch.Tensor, mask: torch.Tensor, prefix: str = "") -> Metrics:
    neg_inf = torch.full_like(ratio, -math.inf)
    has = bool(mask.any())
    return {
        f"{prefix}ratio_mean": masked_mean(ratio, mask),
        f"{prefix}ratio_max": torch.where(mask, ratio, neg_inf).max() if has else torch.zeros((), device=ratio.device),
    }


def dis_band_masks(
    diff: torch.Tensor, mask: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens of ``mask`` whose ratio ``exp(diff)`` (``diff = logp - rollout_logp``) lies below / above the DIS band
    ``(1 - eps_low, 1 + eps_high)``, bounds included. Compared in log space: a logprob difference exactly
    ``log(1 - eps_low)`` or ``log(1 + eps_high)`` is a ratio exactly on the bound, and it is masked (exp cannot land
    exactly on every bound, e.g. 0.2, in float)."""
    low = mask & (diff <= (math.log(1.0 - eps_low) if eps_low < 1.0 else -math.inf))
    high = mask & (diff >= math.log1p(eps_high))
    return low, high


def dis_policy_loss(
    logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    logits: torch.Tensor | None = None,
    normalizer: float | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> tuple[torch.Tensor, Metrics]:
    """DIS, the SAO policy loss: ``L = -mean_t[ sg(f(r_t)) * A_t * logp_t ]`` over action tokens.

    ``r = exp(logp - rollout_logp)`` against the engine's sampling logprob; ``f(r) = r`` when
    ``1 - eps_low < r < 1 + eps_high`` (strict), else 0, so a token outside the band contributes nothing.
    The gradient w.r.t. ``logp_t`` is exactly ``-f(r_t) * A_t / N``; an entropy bonus (``entropy``,
    ``entropy_coef``) is subtracted over the kept tokens only, so a masked token gets no gradient at all.
    Metrics: ``mask_frac_low``/``high``
    (share of action tokens cut below/above), ``ratio_mean``, ``ratio_max``, ``logp_diff_abs_mean``,
    ``kept_frac``, ``num_tokens``, and ``entropy`` when ``logits`` are given.
    Raises ValueError on shape mismatch, NaN/inf on action tokens, ``eps_low`` outside (0, 1] or ``eps_high <= 0``.
    """
    _check_shapes(logp=logp, rollout_logp=rollout_logp, advantages=advantages, action_mask=action_mask)
    _check_eps(eps_low, eps_high)
    mask = action_mask.bool()
    _check_finite(mask, logp=logp.detach(), rollout_logp=rollout_logp, advantages=advantages)
    calc = torch.promote_types(logp.dtype, torch.float32)
    diff = torch.where(mask, logp.detach().to(calc) - rollout_logp.to(calc), torch.zeros((), dtype=calc))
    ratio = torch.exp(diff)
    low, high = dis_band_masks(diff, mask, eps_low, eps_high)
    keep = mask & ~low & ~high
    weight = torch.where(keep, ratio, torch.zeros_like(ratio))
    coef = weight * torch.where(mask, advantages.to(calc), torch.zeros((), dtype=calc))
    safe_logp = torch.where(mask, logp, torch.zeros_like(logp))
    loss = -(coef * safe_logp).sum() / _denominator(mask, normalizer)
    loss = loss - _entropy_bonus(entropy, entropy_coef, keep, mask, normalizer)
    n = mask.sum().clamp(min=1).float()
    metrics: Metrics = {
        "mask_frac_low": low.sum() / n,
        "mask_frac_high": high.sum() / n,
        "kept_frac": keep.sum() / n,
        "logp_diff_abs_mean": masked_mean(diff.abs(), mask),
        "num_tokens": mask.sum().float(),
        **_ratio_metrics(ratio, mask),
    }
    if logits is not None:
        metrics["entropy"] = entropy_from_logits(logits, mask)
    return loss, {k: v.detach() for k, v in metrics.items()}


def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)`` and where the clip is the active branch."""
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    return torch.minimum(unclipped, clipped), clipped < unclipped


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    logits: torch.Tensor | None = None,
    normalizer: float | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate against an old-policy recompute, ``r = exp(logp - old_logp)``, token-mean.

    Asymmetric widths allow DAPO-style clip-higher; ``eps_low == eps_high`` is classic PPO (the GRPO baseline).
    Metrics: ``clip_frac``, ``ratio_mean``, ``ratio_max``, ``num_tokens``, ``entropy`` (with logits).
    """
    # Decoupled PPO whose behaviour policy is the proximal one: every behaviour weight is exactly 1.
    loss, metrics = decoupled_ppo_loss(
        logp,
        old_logp,
        old_logp,
        advantages,
        action_mask,
        eps_low,
        eps_high,
        None,
        logits,
        normalizer,
        entropy,
        entropy_coef,
    )
    for key in ("behavior_weight_mean", "behavior_drop_frac"):
        metrics.pop(key)
    return loss, metrics


def decoupled_ppo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    behavior_weight_cap: float | None = None,
    logits: torch.Tensor | None = None,
    normalizer: float | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> tuple[torch.Tensor, Metrics]:
    """Decoupled PPO: the trust region is around a proximal policy, the off-policy correction is separate.

    ``L = -mean_t[ w_t * min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t) ]`` with the clip ratio
    ``r = exp(logp - old_logp)`` against the proximal (old-policy recompute) and the behaviour weight
    ``w = sg(exp(old_logp - rollout_logp))`` correcting for the stale sampler. Tokens with
    ``w > behavior_weight_cap`` are dropped (the entropy bonus, if any, skips them too). Metrics add
    ``behavior_weight_mean`` and ``behavior_drop_frac``.
    """
    _check_shapes(
        logp=logp, old_logp=old_logp, rollout_logp=rollout_logp, advantages=advantages, action_mask=action_mask
    )
    _check_eps(eps_low, eps_high)
    if behavior_weight_cap is not None and not behavior_weight_cap > 0:
        raise ValueError(f"behavior_weight_cap must be > 0 or None, got {behavior_weight_cap!r}")
    mask = action_mask.bool()
    _check_finite(mask, logp=logp.detach(), old_logp=old_logp, rollout_logp=rollout_logp, advantages=advantages)
    zero = torch.zeros_like(logp)
    ratio = torch.exp(torch.where(mask, logp - old_logp.to(logp.dtype), zero))
    behav = torch.exp(torch.where(mask, old_logp.to(logp.dtype) - rollout_logp.to(logp.dtype), zero)).detach()
    dropped = mask & (behav > behavior_weight_cap) if behavior_weight_cap is not None else torch.zeros_like(mask)
    live = mask & ~dropped
    adv = torch.where(live, advantages.to(logp.dtype), zero)
    surr, clipped = _clipped_surrogate(ratio, adv, eps_low, eps_high)
    loss = -torch.where(live, behav * surr, zero).sum() / _denominator(mask, normalizer)
    loss = loss - _entropy_bonus(entropy, entropy_coef, live, mask, normalizer)
    n = mask.sum().clamp(min=1).float()
    metrics: Metrics = {
        "clip_frac": (clipped & live).sum() / n,
        "behavior_weight_mean": masked_mean(behav, mask),
        "behavior_drop_frac": dropped.sum() / n,
        "num_tokens": mask.sum().float(),
        **_ratio_metrics(ratio.detach(), mask),
    }
    if logits is not None:
        metrics["entropy"] = entropy_from_logits(logits, mask)
    return loss, {k: v.detach() for k, v in metrics.items()}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    action_mask: torch.Tensor,
    clip: float | None,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Clipped value MSE: ``0.5 * max((V - R)^2, (V_clip - R)^2)``, ``V_clip = V_old + clamp(V - V_old, +-clip)``.

    Token-mean over action tokens; ``clip=None`` gives the plain ``0.5 * (V - R)^2``. Metrics: ``vf_clip_frac``
    (tokens where the clipped branch is the larger), ``value_mean``, ``return_mean``, ``explained_variance``.
    """
    _check_shapes(values=values, old_values=old_values, returns=returns, action_mask=action_mask)
    if clip is not None and not clip > 0:
        raise ValueError(f"value clip must be > 0 or None, got {clip!r}")
    mask = action_mask.bool()
    _check_finite(mask, values=values.detach(), old_values=old_values, returns=returns)
    zero = torch.zeros_like(values)
    ret = returns.to(values.dtype)
    err = (values - ret) ** 2
    if clip is None:
        per_tok = err
        clipped = torch.zeros_like(mask)
    else:
        old = old_values.to(values.dtype)
        v_clip = old + torch.clamp(values - old, -clip, clip)
        err_clip = (v_clip - ret) ** 2
        per_tok = torch.maximum(err, err_clip)
        clipped = err_clip > err
    loss = 0.5 * torch.where(mask, per_tok, zero).sum() / _denominator(mask, normalizer)
    n = mask.sum().clamp(min=1).float()
    metrics: Metrics = {
        "vf_clip_frac": (clipped & mask).sum() / n,
        "value_mean": masked_mean(values.detach(), mask),
        "return_mean": masked_mean(ret, mask),
        "explained_variance": explained_variance(values.detach(), returns, mask),
    }
    return loss, {k: v.detach() for k, v in metrics.items()}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``1 - Var[R - V] / Var[R]`` over the masked tokens (float64); NaN when ``Var[R] == 0`` or < 2 tokens."""
    m = mask.bool()
    v = values.detach()[m].double()
    r = returns.detach()[m].double()
    if r.numel() < 2:
        return torch.tensor(math.nan)
    var_r = r.var(unbiased=False)
    if float(var_r) == 0.0:
        return torch.tensor(math.nan)
    return (1.0 - (r - v).var(unbiased=False) / var_r).float()


def explained_variance_sums(
    values: list[torch.Tensor], returns: list[torch.Tensor], masks: list[torch.Tensor]
) -> list[float]:
    """Sums over micro batches (all-reduce them across ranks) from which ``explained_variance_from_sums`` gives the
    explained variance ``1 - Var(R - V) / Var(R)`` of the whole batch."""
    n = s_r = s_r2 = s_e = s_e2 = 0.0
    for v, r, mk in zip(values, returns, masks, strict=True):
        rr, ee = r[mk].double(), (r - v)[mk].double()
        n += rr.numel()
        s_r += float(rr.sum())
        s_r2 += float((rr**2).sum())
        s_e += float(ee.sum())
        s_e2 += float((ee**2).sum())
    return [n, s_r, s_r2, s_e, s_e2]


def explained_variance_from_sums(sums: list[float]) -> float:
    """The whole batch's explained variance from ``explained_variance_sums``; NaN under 2 tokens or when
    ``Var(R)`` is 0."""
    n, s_r, s_r2, s_e, s_e2 = sums
    if n < 2:
        return float("nan")
    var_r = s_r2 / n - (s_r / n) ** 2
    var_e = s_e2 / n - (s_e / n) ** 2
    return 1.0 - var_e / var_r if var_r > 1e-12 else float("nan")


@register_policy_loss("dis", dis_band=True, entropy_bonus=True)
def _dis_entry(x: PolicyLossInputs) -> tuple[torch.Tensor, Metrics]:
    return dis_policy_loss(
        x.logp, x.rollout_logp, x.advantages, x.action_mask, x.eps_low, x.eps_high, x.logits, x.normalizer,
        x.entropy, x.entropy_coef,
    )  # fmt: skip


def _old(x: PolicyLossInputs, name: str) -> torch.Tensor:
    if x.old_logp is None:
        raise ValueError(
            f"policy loss {name!r} needs old_logp (a no-grad recompute with the pre-update weights) in "
            "PolicyLossInputs; use 'dis' to train against the rollout logprobs alone"
        )
    return x.old_logp


@register_policy_loss("ppo_clip", needs_old_logp=True, entropy_bonus=True)
def _ppo_entry(x: PolicyLossInputs) -> tuple[torch.Tensor, Metrics]:
    return ppo_clip_loss(
        x.logp, _old(x, "ppo_clip"), x.advantages, x.action_mask, x.eps_low, x.eps_high, x.logits, x.normalizer,
        x.entropy, x.entropy_coef,
    )  # fmt: skip


@register_policy_loss("decoupled_ppo", needs_old_logp=True, entropy_bonus=True)
def _decoupled_entry(x: PolicyLossInputs) -> tuple[torch.Tensor, Metrics]:
    return decoupled_ppo_loss(
        x.logp,
        _old(x, "decoupled_ppo"),
        x.rollout_logp,
        x.advantages,
        x.action_mask,
        x.eps_low,
        x.eps_high,
        x.behavior_weight_cap,
        x.logits,
        x.normalizer,
        x.entropy,
        x.entropy_coef,
    )
