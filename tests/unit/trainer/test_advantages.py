"""Advantage estimators against slow loop references, hand-computed cases, invariances, registry lookups."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sao.trainer.algos.advantages import RunningMeanBaseline, gae, grpo_advantages, skip_observation_gae
from sao.trainer.algos.reference import grpo_loop, skip_observation_gae_loop
from sao.trainer.algos.registry import (
    AdvantageInputs,
    Registry,
    advantage_names,
    get_advantage,
    register_advantage,
)

FAST = settings(max_examples=60, deadline=None)

# A row is a list of blocks: (is_action, length); length 0 gives empty turns, 1 one-token actions.
blocks = st.lists(st.tuples(st.booleans(), st.integers(0, 5)), min_size=0, max_size=8)
gammas = st.one_of(st.just(1.0), st.just(0.0), st.floats(0.0, 1.0))


def _masks(rows: list[list[tuple[bool, int]]], extra_pad: int) -> torch.Tensor:
    flat = [[a for a, n in row for _ in range(n)] for row in rows]
    t = max([len(r) for r in flat] + [1]) + extra_pad
    return torch.tensor([r + [False] * (t - len(r)) for r in flat], dtype=torch.bool)


@st.composite
def gae_case(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float]:
    rows = draw(st.lists(blocks, min_size=1, max_size=5))
    mask = _masks(rows, draw(st.integers(0, 3)))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    rewards = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    values = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    return rewards, values, mask, draw(gammas), draw(gammas)


@FAST
@given(gae_case())
def test_skip_observation_gae_matches_loop(case: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float]) -> None:
    rewards, values, mask, gamma, lam = case
    adv, ret = skip_observation_gae(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = skip_observation_gae_loop(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-9, atol=1e-9)
    assert bool((adv[~mask] == 0).all()) and bool((ret[~mask] == 0).all())


@FAST
@given(gae_case())
def test_float32_and_int_mask_agree_with_loop(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float],
) -> None:
    rewards, values, mask, gamma, lam = case
    adv, ret = skip_observation_gae(rewards.float(), values.float(), mask.int(), gamma, lam)
    ref_adv, ref_ret = skip_observation_gae_loop(rewards.float(), values.float(), mask, gamma, lam)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv.double(), ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret.double(), ref_ret, rtol=1e-5, atol=1e-5)


@FAST
@given(gae_case(), st.integers(0, 2**31))
def test_observation_tokens_change_nothing(
    case: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float, float], seed: int
) -> None:
    rewards, values, mask, gamma, lam = case
    g = torch.Generator().manual_seed(seed)
    noise = 100 * torch.randn(mask.shape, generator=g, dtype=torch.float64)
    adv, ret = skip_observation_gae(rewards, values, mask, gamma, lam)
    adv2, ret2 = skip_observation_gae(
        torch.where(mask, rewards, noise), torch.where(mask, values, -noise), mask, gamma, lam
    )
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)


def test_two_turn_trajectory_by_hand() -> None:
    # tokens: P P A A O O A A A ; turn 0 = positions 2-3, turn 1 = positions 6-8
    action = torch.tensor([[0, 0, 1, 1, 0, 0, 1, 1, 1]], dtype=torch.bool)
    values = torch.tensor([[9.0, 9.0, 0.5, 0.4, 100.0, -100.0, 0.6, 0.7, 0.8]], dtype=torch.float64)
    rewards = torch.tensor([[7.0, 0.0, 0.0, 0.1, 5.0, 5.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    g, lam = 0.9, 0.8
    # A8 = 1 - 0.8;  A7 = 0.9*0.8 - 0.7 + 0.72*A8;  A6 = 0.9*0.7 - 0.6 + 0.72*A7
    # A3 = 0.1 + 0.9*0.6 - 0.4 + 0.72*A6  (bootstraps from V6, the next ACTION token, across the observation)
    # A2 = 0.9*0.4 - 0.5 + 0.72*A3
    expected = [0.0, 0.0, 0.109564672, 0.3466176, 0.0, 0.0, 0.14808, 0.164, 0.2]
    expected_ret = [0.0, 0.0, 0.609564672, 0.7466176, 0.0, 0.0, 0.74808, 0.864, 1.0]
    adv, ret = skip_observation_gae(rewards, values, action, g, lam)
    torch.testing.assert_close(adv[0], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(ret[0], torch.tensor(expected_ret, dtype=torch.float64), rtol=0, atol=1e-12)
    # token GAE over the response (actions and observations) does bootstrap through observation values
    response = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    adv_tok, _ = gae(rewards, values, response, g, lam)
    assert not math.isclose(float(adv_tok[0, 3]), expected[3], abs_tol=1e-3)
    ref, _ = skip_observation_gae_loop(rewards, values, response, g, lam)
    torch.testing.assert_close(adv_tok, ref, rtol=1e-9, atol=1e-12)


def test_targets_carry_no_gradient() -> None:
    values = torch.randn(2, 5, requires_grad=True)
    adv, ret = skip_observation_gae(torch.ones(2, 5), values, torch.ones(2, 5), 0.9, 0.9)
    assert not adv.requires_grad and not ret.requires_grad


def test_all_masked_rows_and_empty_batch_give_zeros() -> None:
    z = torch.zeros(3, 4)
    adv, ret = skip_observation_gae(torch.ones(3, 4), torch.ones(3, 4), z, 0.9, 0.9)
    assert torch.equal(adv, z) and torch.equal(ret, z)
    adv, _ = skip_observation_gae(torch.ones(0, 5), torch.ones(0, 5), torch.zeros(0, 5), 1.0, 1.0)
    assert adv.shape == (0, 5)


def test_long_rows_cross_many_chunks() -> None:
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(3, 3000, generator=g) < 0.6
    r = torch.randn(3, 3000, generator=g, dtype=torch.float64)
    v = torch.randn(3, 3000, generator=g, dtype=torch.float64)
    for gamma, lam in ((1.0, 1.0), (0.999, 0.95), (0.3, 0.5)):
        adv, ret = skip_observation_gae(r, v, mask, gamma, lam)
        ref_adv, ref_ret = skip_observation_gae_loop(r, v, mask, gamma, lam)
        torch.testing.assert_close(adv, ref_adv, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(ret, ref_ret, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("c", [0.0, 0.5, 0.97, 1.0])
def test_blocked_scan_matches_the_recursion_at_every_depth(c: float) -> None:
    from sao.trainer.algos.advantages import _discounted_reverse_cumsum

    # 35000 > 32**3 steps: the chunk heads recurse three levels deep
    x = torch.randn(1, 35000, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ref, acc = [0.0] * x.shape[1], 0.0
    for k, xk in reversed(list(enumerate(x[0].tolist()))):
        acc = xk + c * acc
        ref[k] = acc
    torch.testing.assert_close(_discounted_reverse_cumsum(x, c)[0], torch.tensor(ref, dtype=torch.float64))


def test_bad_input_is_a_clear_value_error() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="one shape"):
        skip_observation_gae(x, torch.zeros(2, 4), x, 1.0, 1.0)
    with pytest.raises(ValueError, match="gamma"):
        skip_observation_gae(x, x, x, 1.5, 1.0)
    with pytest.raises(ValueError, match="lam"):
        skip_observation_gae(x, x, x, 1.0, -0.1)


@FAST
@given(
    st.lists(st.tuples(st.floats(-10, 10), st.integers(0, 4)), min_size=1, max_size=20),
    st.booleans(),
)
def test_grpo_matches_loop(items: list[tuple[float, int]], scale: bool) -> None:
    rewards = [r for r, _ in items]
    groups = [g for _, g in items]
    got = grpo_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups), scale_by_std=scale)
    torch.testing.assert_close(got, torch.tensor(grpo_loop(rewards, groups, scale_by_std=scale), dtype=torch.float64))


def test_grpo_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="group_ids"):
        grpo_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))


def test_running_mean_baseline() -> None:
    base = RunningMeanBaseline()
    torch.testing.assert_close(base.advantage(torch.tensor([1.0, 3.0])), torch.tensor([-1.0, 1.0]))
    base.update(torch.tensor([1.0, 3.0]))
    base.update(torch.tensor([5.0]))
    assert base.mean == pytest.approx(3.0) and base.count == 3
    torch.testing.assert_close(base.advantage(torch.tensor([4.0])), torch.tensor([1.0]))
    ema = RunningMeanBaseline(decay=0.5)
    ema.update(torch.tensor([2.0, 4.0]))
    assert ema.mean == pytest.approx(0.5 * 2.0 + 0.5 * 4.0)
    clone = RunningMeanBaseline()
    clone.load_state_dict(ema.state_dict())
    assert clone.mean == ema.mean and clone.decay == 0.5
    with pytest.raises(ValueError, match="non-finite"):
        base.update(torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="decay"):
        RunningMeanBaseline(decay=1.0)


def test_registry_has_the_estimators_and_one_calling_convention() -> None:
    assert {"skip_obs_gae", "gae", "grpo", "running_mean"} <= set(advantage_names())
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    values = torch.full((2, 4), 0.25)
    inputs = AdvantageInputs(
        rewards=rewards,
        action_mask=mask,
        values=values,
        group_ids=torch.tensor([0, 0]),
        baseline=RunningMeanBaseline(),
        gamma=1.0,
        lam=1.0,
    )
    for name in ("skip_obs_gae", "gae", "grpo", "running_mean"):
        adv, ret = get_advantage(name)(inputs)
        assert adv.shape == ret.shape == (2, 4), name
        assert bool((adv[~mask] == 0).all()), name
    adv, _ = get_advantage("grpo")(inputs)
    torch.testing.assert_close(adv[0, 1:3], torch.full((2,), 0.5 / (math.sqrt(0.5) + 1e-6)))
    adv, _ = get_advantage("running_mean")(inputs)  # baseline was 0.5 after the first call's update
    torch.testing.assert_close(adv[1, 2:], torch.full((2,), -0.5))


def test_registry_errors() -> None:
    with pytest.raises(ValueError, match=r"registered: .*skip_obs_gae"):
        get_advantage("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("gae")(lambda x: (x.rewards, x.rewards))
    with pytest.raises(ValueError, match="critic values"):
        get_advantage("skip_obs_gae")(AdvantageInputs(rewards=torch.zeros(1, 2), action_mask=torch.ones(1, 2)))
    with pytest.raises(ValueError, match="group_ids"):
        get_advantage("grpo")(AdvantageInputs(rewards=torch.zeros(1, 2), action_mask=torch.ones(1, 2)))
    with pytest.raises(ValueError, match="RunningMeanBaseline"):
        get_advantage("running_mean")(AdvantageInputs(rewards=torch.zeros(1, 2), action_mask=torch.ones(1, 2)))
    reg: Registry[object] = Registry("thing")
    with pytest.raises(ValueError, match="non-empty"):
        reg.register("")(print)
