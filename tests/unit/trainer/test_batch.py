"""Trajectories -> Batch: exact token layout, reward placement (rewards where they happen), group ids, row slices."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from sao.agent.records import Segment, Trajectory
from sao.trainer.learn.batch import collate

PAD = 0


def act(ids: list[int], version: int = 3, reward: float | None = None) -> Segment:
    return Segment("action", tuple(ids), logprobs=tuple(-0.1 * i for i in ids), policy_version=version, reward=reward)


def obs(ids: list[int]) -> Segment:
    return Segment("observation", tuple(ids))


def prompt(ids: list[int]) -> Segment:
    return Segment("prompt", tuple(ids))


def two_turns(task: str = "t", reward: float = 1.0) -> Trajectory:
    segs = (prompt([5, 6]), act([7, 8], 1, reward=0.25), obs([9]), act([10, 11, 12], 2))
    return Trajectory(task, "sao/test", segs, reward)


def test_collate_lays_out_tokens_exactly() -> None:
    short = Trajectory("u", "sao/test", (prompt([1]), act([2])), 0.5)
    b = collate([two_turns(), short], pad_token_id=PAD)
    assert b.shape == (2, 8)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 0, 0, 0, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1] * 8, [1, 1] + [0] * 6]
    assert b.position_ids[1].tolist() == [0, 1, 0, 0, 0, 0, 0, 0]
    assert b.action_mask.int().tolist() == [[0, 0, 1, 1, 0, 1, 1, 1], [0, 1, 0, 0, 0, 0, 0, 0]]
    assert b.response_mask.int().tolist()[0] == [0, 0, 1, 1, 1, 1, 1, 1]
    torch.testing.assert_close(b.rollout_logprobs[0, 2:4], torch.tensor([-0.7, -0.8]))
    assert float(b.rollout_logprobs[0, 4]) == 0.0
    # the turn's reward on its last token; the rest of the total (1.0 - 0.25) on the last action token
    assert b.rewards.tolist()[0] == [0, 0, 0, 0.25, 0, 0, 0, 0.75]
    assert b.rewards.tolist()[1][:2] == [0, 0.5]
    torch.testing.assert_close(b.rewards.sum(1), torch.tensor([1.0, 0.5]))  # never counted twice
    old = Trajectory("t", "sao/test", tuple(replace(s, reward=None) for s in two_turns().segments), 1.0)
    assert collate([old], pad_token_id=PAD).rewards.tolist()[0] == [0, 0, 0, 0, 0, 0, 0, 1.0]


def test_group_ids_come_from_the_trajectory() -> None:
    trajs = [replace(two_turns("a"), group_id=7), two_turns("a"), replace(two_turns("b"), group_id=7), two_turns("a")]
    b = collate(trajs, pad_token_id=PAD)
    g = b.group_ids.tolist()
    assert g[0] == g[2] == 7
    assert len({g[1], g[3], 7}) == 3  # no group id: a group of its own, whatever the task id


def test_rows_and_to_slice_every_field() -> None:
    b = collate([two_turns("a"), Trajectory("u", "e", (prompt([1]), act([2])), 0.5)], pad_token_id=PAD)
    r = b.rows([1]).to("cpu")
    assert (
        r.shape == (1, 8) and r.input_ids.tolist()[0][:2] == [1, 2] and r.group_ids.tolist() == b.group_ids.tolist()[1:]
    )


def test_empty_action_turn_reward_goes_to_the_previous_action_token() -> None:
    segs = (prompt([1]), act([2, 3]), obs([4]), act([], reward=0.5))
    b = collate([Trajectory("t", "e", segs, 1.0)], pad_token_id=PAD)
    assert b.rewards.tolist()[0] == [0, 0, 1.0, 0]
    lone = (prompt([1]), act([], reward=0.5), act([2]))
    with pytest.raises(ValueError, match="no action token to carry it"):
        collate([Trajectory("t", "e", lone, 1.0)], pad_token_id=PAD)


def test_bad_batches_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="empty list"):
        collate([], pad_token_id=PAD)
    bad = Trajectory("t", "e", two_turns().segments, 0.0, status="infra_error")
    with pytest.raises(ValueError, match="infra_error"):
        collate([bad], pad_token_id=PAD)
    with pytest.raises(ValueError, match="no action tokens"):
        collate([Trajectory("t", "e", (prompt([1]), obs([2])), 1.0)], pad_token_id=PAD)
    with pytest.raises(ValueError, match="max_len=4"):
        collate([two_turns()], pad_token_id=PAD, max_len=4)
    with pytest.raises(ValueError, match="non-finite"):
        collate([Trajectory("t", "e", two_turns().segments, float("nan"))], pad_token_id=PAD)
    inf_turn = (prompt([1]), act([2], reward=float("inf")))
    with pytest.raises(ValueError, match="non-finite"):
        collate([Trajectory("t", "e", inf_turn, 1.0)], pad_token_id=PAD)


def test_pad_to_multiple_of() -> None:
    assert collate([two_turns()], pad_token_id=PAD, pad_to_multiple_of=16).shape == (1, 16)
