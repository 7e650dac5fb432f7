"""A truncated episode (a limit ended it) bootstraps from V at the cut; a terminated one takes V = 0 after it."""

from __future__ import annotations

import pytest
import torch

from sao.trainer.algos.advantages import gae, skip_observation_gae
from sao.trainer.algos.reference import skip_observation_gae_loop
from sao.trainer.algos.registry import AdvantageInputs, get_advantage

# one row: prompt, action (2 tokens), observation, action (2 tokens), then padding
MASK = torch.tensor([[0, 1, 1, 0, 1, 1, 0]], dtype=torch.bool)
VALUES = torch.tensor([[0.0, 0.2, 0.3, 9.0, 0.5, 0.7, 9.0]])
REWARDS = torch.tensor([[0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95), (1.0, 0.0)])
def test_truncated_row_bootstraps_from_the_value_at_its_last_action_token(gamma: float, lam: float) -> None:
    adv, ret = skip_observation_gae(REWARDS, VALUES, MASK, gamma, lam, truncated=torch.tensor([True]))
    # the last action token: delta = r + gamma * V(cut) - V(cut), not r - V(cut)
    assert adv[0, 5].item() == pytest.approx(gamma * 0.7 - 0.7)
    assert ret[0, 5].item() == pytest.approx(gamma * 0.7)
    ref_adv, ref_ret = skip_observation_gae_loop(REWARDS, VALUES, MASK, gamma, lam, torch.tensor([True]))
    assert torch.allclose(adv.double(), ref_adv, atol=1e-6) and torch.allclose(ret.double(), ref_ret, atol=1e-6)


def test_terminated_row_keeps_v_zero_after_the_last_token() -> None:
    adv, ret = skip_observation_gae(REWARDS, VALUES, MASK, 1.0, 1.0, truncated=torch.tensor([False]))
    assert adv[0, 5].item() == pytest.approx(-0.7) and ret[0, 5].item() == pytest.approx(0.0)
    same, _ = skip_observation_gae(REWARDS, VALUES, MASK, 1.0, 1.0)
    assert torch.equal(adv, same)


def test_mixed_batch_matches_the_loop_on_the_sparse_and_dense_paths() -> None:
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(6, 40, generator=g)
    values = torch.rand(6, 40, generator=g)
    mask = torch.rand(6, 40, generator=g) > 0.4
    mask[2] = False  # a row without action tokens
    cut = torch.tensor([True, False, True, False, True, True])
    for gamma, lam in ((1.0, 1.0), (0.97, 0.9), (0.99, 1.0)):
        adv, ret = skip_observation_gae(rewards, values, mask, gamma, lam, truncated=cut)
        ref_adv, ref_ret = skip_observation_gae_loop(rewards, values, mask, gamma, lam, cut)
        assert torch.allclose(adv.double(), ref_adv, atol=1e-5), (gamma, lam)
        assert torch.allclose(ret.double(), ref_ret, atol=1e-5), (gamma, lam)


def test_token_gae_and_the_registry_entries_read_the_truncated_flag() -> None:
    response = torch.tensor([[0, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    adv, _ = gae(REWARDS, VALUES, response, 1.0, 1.0, truncated=torch.tensor([True]))
    assert adv[0, 5].item() == pytest.approx(0.0)  # r 0 + V(cut) - V(cut)
    for name in ("skip_obs_gae", "gae"):
        inputs = AdvantageInputs(REWARDS, MASK, VALUES, response_mask=response, truncated=torch.tensor([True]))
        a, _ = get_advantage(name)(inputs)
        assert a[0, 5].item() == pytest.approx(0.0), name


def test_batch_carries_the_trajectory_status_as_the_truncated_flag() -> None:
    from sao.agent.records import Segment, Trajectory
    from sao.trainer.learn.batch import collate

    segs = (Segment("prompt", (1, 2)), Segment("action", (3, 4), (-0.1, -0.2), 0, 0.0))
    trajs = [Trajectory("a", "e", segs, 0.0, "truncated"), Trajectory("b", "e", segs, 1.0, "ok")]
    assert collate(trajs, 0).truncated.tolist() == [True, False]


def test_a_wrongly_shaped_flag_is_refused() -> None:
    with pytest.raises(ValueError, match="truncated must be"):
        skip_observation_gae(REWARDS, VALUES, MASK, 1.0, 1.0, truncated=torch.tensor([True, False]))
