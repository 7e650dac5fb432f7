"""Policy and value losses: DIS weights and gradients, bounds, metrics, PPO variants, value loss, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.trainer.algos.losses import (
    decoupled_ppo_loss,
    dis_policy_loss,
    entropy_from_logits,
    explained_variance,
    ppo_clip_loss,
    value_loss,
)
from sao.trainer.algos.reference import dis_weights_loop
from sao.trainer.algos.registry import PolicyLossInputs, get_policy_loss, policy_loss_names

FAST = settings(max_examples=40, deadline=None)


@st.composite
def loss_case(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, float]:
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    rollout = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    logp = rollout + 0.4 * torch.randn(b, t, generator=g, dtype=torch.float64)  # ratios both sides of the band
    adv = torch.randn(b, t, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) < draw(st.sampled_from([0.0, 0.5, 1.0]))
    return logp, rollout, adv, mask, draw(st.floats(0.01, 1.0)), draw(st.floats(0.01, 5.0))


@FAST
@given(loss_case())
def test_dis_loss_and_gradient_match_the_formula(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, float],
) -> None:
    logp, rollout, adv, mask, eps_low, eps_high = case
    logp = logp.clone().requires_grad_(True)
    loss, metrics = dis_policy_loss(logp, rollout, adv, mask, eps_low, eps_high)
    loss.backward()
    assert logp.grad is not None
    n = max(int(mask.sum()), 1)
    w = dis_weights_loop(
        logp.detach().flatten().tolist(), rollout.flatten().tolist(), mask.flatten().tolist(), eps_low, eps_high
    )
    f = torch.tensor(w, dtype=torch.float64).view_as(adv)
    # d loss / d logp_t = -f(r_t) * A_t / N: exactly what autograd gives, and exactly 0 where f == 0
    torch.testing.assert_close(logp.grad, -f * adv / n, rtol=1e-12, atol=0)
    assert bool((logp.grad[f == 0] == 0).all())
    torch.testing.assert_close(loss.detach(), -(f * adv * logp.detach()).sum() / n, rtol=1e-10, atol=1e-12)
    r = torch.exp(logp.detach() - rollout)[mask]
    if r.numel():
        assert float(metrics["mask_frac_low"]) == pytest.approx(float((r <= 1 - eps_low).double().mean()))
        assert float(metrics["mask_frac_high"]) == pytest.approx(float((r >= 1 + eps_high).double().mean()))
        assert float(metrics["ratio_mean"]) == pytest.approx(float(r.mean()))
        assert float(metrics["ratio_max"]) == pytest.approx(float(r.max()))
        diff = (logp.detach() - rollout)[mask].abs().mean()
        assert float(metrics["logp_diff_abs_mean"]) == pytest.approx(float(diff))
    else:
        assert float(loss.detach()) == 0.0


@pytest.mark.parametrize(
    ("ratio", "kept"),
    [(1.28 - 1e-6, True), (1.28 + 1e-6, False), (0.8 + 1e-6, True), (0.8 - 1e-6, False), (1.0, True)],
)
def test_dis_bounds_are_strict_and_two_sided(ratio: float, kept: bool) -> None:
    rollout = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    logp = (rollout + torch.tensor([[math.log(ratio), 0.0]], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([[2.0, 3.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False]])
    loss, metrics = dis_policy_loss(logp, rollout, adv, mask, eps_low=0.2, eps_high=0.28)
    loss.backward()
    assert logp.grad is not None
    expected = -ratio * 2.0 if kept else 0.0
    assert float(logp.grad[0, 0]) == pytest.approx(expected, rel=1e-9)
    assert float(logp.grad[0, 1]) == 0.0  # masked token: exactly zero
    assert float(metrics["kept_frac"]) == (1.0 if kept else 0.0)
    assert float(metrics["mask_frac_high"]) == (1.0 if ratio > 1.28 else 0.0)
    assert float(metrics["mask_frac_low"]) == (1.0 if ratio < 0.8 else 0.0)


def test_dis_masked_tokens_may_hold_anything() -> None:
    logp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    rollout = torch.tensor([[-1.0, float("-inf")]])
    loss, _ = dis_policy_loss(logp, rollout, torch.ones(1, 2), torch.tensor([[1, 0]]), 0.2, 0.2)
    loss.backward()
    assert logp.grad is not None
    assert math.isfinite(float(loss.detach())) and float(logp.grad[0, 1]) == 0.0


def test_dis_normalizer_and_entropy() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 11, generator=g)
    mask = torch.tensor([[1, 1, 0, 0, 1], [0, 1, 1, 1, 0]], dtype=torch.bool)
    logp = torch.log_softmax(logits, -1)[..., 3]
    loss, metrics = dis_policy_loss(logp, logp, torch.ones(2, 5), mask, 0.2, 0.2, logits=logits)
    p = torch.softmax(logits, -1)
    ent = -(p * torch.log(p)).sum(-1)[mask].mean()
    assert float(metrics["entropy"]) == pytest.approx(float(ent), rel=1e-5)
    assert float(entropy_from_logits(logits, mask, chunk_tokens=2)) == pytest.approx(float(ent), rel=1e-5)
    loss2, _ = dis_policy_loss(logp, logp, torch.ones(2, 5), mask, 0.2, 0.2, normalizer=12.0)
    assert float(loss2.detach()) == pytest.approx(float(loss.detach()) * 6 / 12, rel=1e-6)


def test_dis_bad_input() -> None:
    x = torch.zeros(2, 3)
    m = torch.ones(2, 3)
    with pytest.raises(ValueError, match="one shape"):
        dis_policy_loss(x, torch.zeros(2, 4), x, m, 0.2, 0.2)
    with pytest.raises(ValueError, match="logp has NaN/inf"):
        dis_policy_loss(torch.tensor([[0.0, float("nan"), 0.0]] * 2), x, x, m, 0.2, 0.2)
    with pytest.raises(ValueError, match="rollout_logp has NaN/inf"):
        dis_policy_loss(x, torch.tensor([[0.0, float("-inf"), 0.0]] * 2), x, m, 0.2, 0.2)
    for lo, hi in ((0.0, 0.2), (1.5, 0.2), (-0.1, 0.2), (0.2, 0.0), (0.2, float("nan"))):
        with pytest.raises(ValueError, match="eps_"):
            dis_policy_loss(x, x, x, m, lo, hi)
    with pytest.raises(ValueError, match="normalizer"):
        dis_policy_loss(x, x, x, m, 0.2, 0.2, normalizer=0.0)


def _ppo_ref(logp: list[float], old: list[float], adv: list[float], lo: float, hi: float) -> list[float]:
    out = []
    for lp, o, a in zip(logp, old, adv, strict=True):
        r = math.exp(lp - o)
        out.append(-min(r * a, min(max(r, 1 - lo), 1 + hi) * a))
    return out


@FAST
@given(loss_case())
def test_ppo_clip_matches_reference(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float, float],
) -> None:
    logp, old, adv, mask, lo, hi = case
    lo = min(lo, 0.99)
    loss, _ = ppo_clip_loss(logp, old, adv, mask, lo, hi)
    m = mask.flatten().tolist()
    per = _ppo_ref(logp.flatten().tolist(), old.flatten().tolist(), adv.flatten().tolist(), lo, hi)
    expected = sum(p for p, k in zip(per, m, strict=True) if k) / max(sum(m), 1)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # decoupled PPO with a behaviour policy equal to the proximal one is plain PPO
    loss2, met = decoupled_ppo_loss(logp, old, old, adv, mask, lo, hi)
    assert float(loss2.detach()) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert float(met["behavior_drop_frac"]) == 0.0


def test_ppo_gradient_is_zero_where_clipped() -> None:
    old = torch.zeros(1, 3, dtype=torch.float64)
    logp = torch.tensor([[math.log(1.5), math.log(1.1), math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, -1.0]], dtype=torch.float64)
    loss, metrics = ppo_clip_loss(logp, old, adv, torch.ones(1, 3), 0.2, 0.2)
    loss.backward()
    assert logp.grad is not None
    assert float(logp.grad[0, 0]) == 0.0 and float(logp.grad[0, 2]) == 0.0  # clipped on the side that matters
    assert float(logp.grad[0, 1]) == pytest.approx(-1.1 / 3)
    assert float(metrics["clip_frac"]) == pytest.approx(2 / 3)


def test_decoupled_ppo_behaviour_weight_and_cap() -> None:
    logp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=torch.float64)
    rollout = torch.tensor([[math.log(0.5), math.log(0.1)]], dtype=torch.float64)  # w = 2 and 10
    adv = torch.ones(1, 2, dtype=torch.float64)
    loss, metrics = decoupled_ppo_loss(logp, old, rollout, adv, torch.ones(1, 2), 0.2, 0.2, behavior_weight_cap=5.0)
    loss.backward()
    assert logp.grad is not None
    assert float(logp.grad[0, 0]) == pytest.approx(-2.0 / 2) and float(logp.grad[0, 1]) == 0.0
    assert float(metrics["behavior_drop_frac"]) == 0.5
    with pytest.raises(ValueError, match="behavior_weight_cap"):
        decoupled_ppo_loss(logp, old, rollout, adv, torch.ones(1, 2), 0.2, 0.2, behavior_weight_cap=0.0)


def test_value_loss_clipped_and_plain() -> None:
    values = torch.tensor([[1.0, 2.0, 0.0, 5.0]], requires_grad=True)
    old = torch.tensor([[0.0, 2.0, 0.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 9.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 1]], dtype=torch.bool)
    loss, metrics = value_loss(values, old, returns, mask, clip=0.5)
    # token 0: max((1-2)^2, (0.5-2)^2) = 2.25 ; token 1: max(1, 1) = 1 ; token 3: max(25, 0.25) = 25
    assert float(loss.detach()) == pytest.approx(0.5 * (2.25 + 1.0 + 25.0) / 3)
    assert float(metrics["vf_clip_frac"]) == pytest.approx(1 / 3)
    loss.backward()
    assert values.grad is not None
    assert float(values.grad[0, 0]) == 0.0  # the clipped branch is active: no gradient through it
    assert float(values.grad[0, 2]) == 0.0  # masked
    plain, _ = value_loss(values, old, returns, mask, clip=None)
    assert float(plain.detach()) == pytest.approx(0.5 * (1.0 + 1.0 + 25.0) / 3)
    with pytest.raises(ValueError, match="clip"):
        value_loss(values, old, returns, mask, clip=-1.0)
    with pytest.raises(ValueError, match="returns has NaN"):
        value_loss(values, old, torch.full((1, 4), float("nan")), mask, clip=None)


def test_explained_variance() -> None:
    r = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    m = torch.ones(1, 4, dtype=torch.bool)
    assert float(explained_variance(r, r, m)) == pytest.approx(1.0)
    assert float(explained_variance(r + 7.0, r, m)) == pytest.approx(1.0)  # a constant offset is not variance
    assert float(explained_variance(torch.zeros(1, 4), r, m)) == pytest.approx(0.0)
    assert float(explained_variance(-r, r, m)) == pytest.approx(1 - 4.0)  # Var[2R] / Var[R]
    assert math.isnan(float(explained_variance(r, torch.ones(1, 4), m)))


def test_policy_loss_registry() -> None:
    assert {"dis", "ppo_clip", "decoupled_ppo"} <= set(policy_loss_names())
    x = torch.zeros(1, 3, requires_grad=True)
    inputs = PolicyLossInputs(
        logp=x, rollout_logp=torch.zeros(1, 3), advantages=torch.ones(1, 3), action_mask=torch.ones(1, 3)
    )
    loss, metrics = get_policy_loss("dis")(inputs)
    assert float(loss.detach()) == pytest.approx(0.0) and "mask_frac_low" in metrics
    with pytest.raises(ValueError, match="old_logp"):
        get_policy_loss("ppo_clip")(inputs)
    with pytest.raises(ValueError, match="registered: "):
        get_policy_loss("reinforce++")
    for name in ("ppo_clip", "decoupled_ppo"):
        loss, _ = get_policy_loss(name)(PolicyLossInputs(**{**inputs.__dict__, "old_logp": torch.zeros(1, 3)}))
        assert float(loss.detach()) == pytest.approx(-1.0)
