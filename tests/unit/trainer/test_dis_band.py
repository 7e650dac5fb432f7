"""The DIS band: the paper's presets, strict bounds, and an entropy bonus that never reaches a masked token."""

from __future__ import annotations

import math

import pytest
import torch

from sao.trainer.algos.losses import decoupled_ppo_loss, dis_policy_loss
from sao.trainer.algos.registry import policy_loss_traits
from sao.trainer.config import DIS_BANDS, ConfigError, config_from_dict


def test_presets_are_the_papers_bands() -> None:
    lo, hi = DIS_BANDS["reasoning"]
    assert (1 - lo, 1 + hi) == pytest.approx((0.7, 6.0))
    lo, hi = DIS_BANDS["coding"]
    assert (1 - lo, 1 + hi) == pytest.approx((0.2, 4.0))
    assert config_from_dict({"trainer": {"dis_band": "coding"}}).dis_bounds == DIS_BANDS["coding"]
    assert config_from_dict({}).dis_bounds == DIS_BANDS["coding"]  # the measured default (docs/benchmarks.md)
    custom = config_from_dict({"trainer": {"dis_band": "custom", "eps_low": 0.5, "eps_high": 1.0}})
    assert custom.dis_bounds == (0.5, 1.0)
    with pytest.raises(ConfigError, match=r"trainer\.dis_band"):
        config_from_dict({"trainer": {"dis_band": "swe"}})
    assert policy_loss_traits("dis").dis_band and not policy_loss_traits("ppo_clip").dis_band


@pytest.mark.parametrize("band", ["reasoning", "coding"])
def test_a_ratio_exactly_on_a_bound_is_masked(band: str) -> None:
    lo, hi = DIS_BANDS[band]
    # log-ratios exactly log(1 - lo) and log(1 + hi) (ratios on the bounds), just inside each, and 0
    points = [math.log(1 - lo), math.log1p(hi), math.log(1 - lo) + 1e-3, math.log1p(hi) - 1e-3, 0.0]
    logp = torch.tensor([points], dtype=torch.float32)
    zero = torch.zeros_like(logp)
    _, m = dis_policy_loss(logp, zero, torch.ones_like(logp), torch.ones_like(logp, dtype=torch.bool), lo, hi)
    assert m["mask_frac_low"].item() == pytest.approx(0.2) and m["mask_frac_high"].item() == pytest.approx(0.2)
    assert m["kept_frac"].item() == pytest.approx(0.6)


def test_entropy_bonus_gives_no_gradient_to_dis_masked_tokens() -> None:
    # issue 23 defect 5: the learner added the bonus over every action token, masked ones included
    logp = torch.log(torch.tensor([[1.0, 3.0, 0.1]])).requires_grad_(False)  # token 2 and 3 outside (0.5, 2)
    entropy = torch.tensor([[0.5, 0.5, 0.5]], requires_grad=True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, m = dis_policy_loss(
        logp, torch.zeros(1, 3), torch.ones(1, 3), mask, 0.5, 1.0, entropy=entropy, entropy_coef=0.1
    )
    loss.backward()
    assert m["kept_frac"].item() == pytest.approx(1 / 3)
    assert entropy.grad is not None
    assert entropy.grad[0, 0].item() == pytest.approx(-0.1 / 3) and entropy.grad[0, 1:].abs().sum().item() == 0.0


def test_entropy_bonus_skips_behaviour_dropped_tokens_in_decoupled_ppo() -> None:
    logp = torch.zeros(1, 2, requires_grad=True)
    old = torch.zeros(1, 2)
    rollout = torch.tensor([[0.0, -math.log(5.0)]])  # token 2: behaviour weight 5 > cap 2, dropped
    entropy = torch.ones(1, 2, requires_grad=True)
    loss, _ = decoupled_ppo_loss(
        logp, old, rollout, torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool), 0.2, 0.2, 2.0,
        entropy=entropy, entropy_coef=0.1,
    )  # fmt: skip
    loss.backward()
    assert entropy.grad is not None and entropy.grad[0, 1].item() == 0.0 and entropy.grad[0, 0].item() < 0
