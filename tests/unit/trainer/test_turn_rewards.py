"""Rewards where they happen: a turn's reward on its last action token, advantages against a hand computation."""

from __future__ import annotations

import pytest
import torch

from sao.agent.records import Segment, Trajectory
from sao.trainer.algos.registry import AdvantageInputs, get_advantage
from sao.trainer.learn.batch import collate


def _act(ids: list[int], reward: float | None) -> Segment:
    return Segment("action", tuple(ids), tuple(-0.5 for _ in ids), 0, reward)


def test_three_turns_paying_at_turns_one_and_three_match_a_hand_computation() -> None:
    # P | A1 A1 | O | A2 | O O | A3 A3 ; turn 1 pays 0.5, turn 2 nothing, turn 3 pays 1.0 (total 1.5)
    segs = (
        Segment("prompt", (1,)),
        _act([2, 3], 0.5),
        Segment("observation", (4,)),
        _act([5], 0.0),
        Segment("observation", (6, 7)),
        _act([8, 9], 1.0),
    )
    b = collate([Trajectory("t", "e", segs, 1.5)], pad_token_id=0)
    assert b.rewards[0].tolist() == [0, 0, 0.5, 0, 0, 0, 0, 0, 1.0]
    action = b.action_mask[0].nonzero().squeeze(1).tolist()
    assert action == [1, 2, 4, 7, 8]
    values = torch.full(b.shape, 99.0)  # observation/prompt values must never be read
    values[0, action] = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])
    adv, ret = get_advantage("skip_obs_gae")(
        AdvantageInputs(rewards=b.rewards, action_mask=b.action_mask, values=values, gamma=0.9, lam=0.8)
    )
    # By hand, over the action tokens k = 0..4 (r = 0, 0.5, 0, 0, 1; V = .1 .. .5; V after the last = 0):
    # delta_k = r_k + 0.9 V_{k+1} - V_k = 0.08, 0.57, 0.06, 0.05, 0.5 ; A_k = delta_k + 0.72 A_{k+1}
    a4 = 0.5
    a3 = 0.05 + 0.72 * a4  # 0.41
    a2 = 0.06 + 0.72 * a3  # turn 2 = 0.3552
    a1 = 0.57 + 0.72 * a2  # last token of turn 1 = 0.825744
    a0 = 0.08 + 0.72 * a1
    expected = [a0, a1, a2, a3, a4]
    assert adv[0, action].tolist() == pytest.approx(expected, abs=1e-6)
    assert ret[0, action].tolist() == pytest.approx(
        [a + v for a, v in zip(expected, [0.1, 0.2, 0.3, 0.4, 0.5], strict=True)], abs=1e-6
    )
    # The old placement (the whole 1.5 on the last token) gives turn 1 a different advantage: per-turn credit matters.
    lumped = torch.zeros_like(b.rewards)
    lumped[0, 8] = 1.5
    adv_lumped, _ = get_advantage("skip_obs_gae")(
        AdvantageInputs(rewards=lumped, action_mask=b.action_mask, values=values, gamma=0.9, lam=0.8)
    )
    assert abs(float(adv_lumped[0, 2]) - a1) > 0.1
