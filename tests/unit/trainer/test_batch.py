"""Trajectories -> Batch: exact token layout, reward placement, packing, and GAE on packed rows."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.records import Segment, Trajectory
from trainer.algos.advantages import skip_observation_gae
from trainer.batch import collate, pack

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
    b = collate([two_turns(), short], pad_token_id=PAD, per_turn_rewards=True)
    assert b.shape == (2, 8)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 11, 12], [1, 2, 0, 0, 0, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1] * 8, [1, 1] + [0] * 6]
    assert b.position_ids[1].tolist() == [0, 1, 0, 0, 0, 0, 0, 0]
    assert b.action_mask.int().tolist() == [[0, 0, 1, 1, 0, 1, 1, 1], [0, 1, 0, 0, 0, 0, 0, 0]]
    assert b.response_mask.int().tolist()[0] == [0, 0, 1, 1, 1, 1, 1, 1]
    assert b.turn_ids.tolist()[0] == [-1, -1, 0, 0, -1, 1, 1, 1]
    assert b.policy_version.tolist()[0] == [-1, -1, 1, 1, -1, 2, 2, 2]
    torch.testing.assert_close(b.rollout_logprobs[0, 2:4], torch.tensor([-0.7, -0.8]))
    assert float(b.rollout_logprobs[0, 4]) == 0.0
    # the final reward on the last action token, the per-turn reward on its turn's last token
    assert b.rewards.tolist()[0] == [0, 0, 0, 0.25, 0, 0, 0, 1.0]
    assert b.rewards.tolist()[1][:2] == [0, 0.5]
    assert b.seq_ids.tolist()[1] == [1, 1, -1, -1, -1, -1, -1, -1]
    assert b.cu_seqlens.tolist() == [0, 8, 10]
    without = collate([two_turns()], pad_token_id=PAD)
    assert without.rewards.tolist()[0] == [0, 0, 0, 0, 0, 0, 0, 1.0]


def test_group_ids_and_seq_rewards() -> None:
    b = collate([two_turns("a", 1.0), two_turns("b", 0.0), two_turns("a", 0.5)], pad_token_id=PAD)
    assert b.group_ids.tolist() == [0, 1, 0]
    assert b.seq_rewards.tolist() == [1.0, 0.0, 0.5]


def test_empty_action_turn_reward_goes_to_the_previous_action_token() -> None:
    segs = (prompt([1]), act([2, 3]), obs([4]), act([], reward=0.5))
    b = collate([Trajectory("t", "e", segs, 1.0)], pad_token_id=PAD, per_turn_rewards=True)
    assert b.rewards.tolist()[0] == [0, 0, 1.5, 0]
    lone = (prompt([1]), act([], reward=0.5), act([2]))
    with pytest.raises(ValueError, match="no action token to carry it"):
        collate([Trajectory("t", "e", lone, 1.0)], pad_token_id=PAD, per_turn_rewards=True)


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


def test_pad_to_multiple_of() -> None:
    assert collate([two_turns()], pad_token_id=PAD, pad_to_multiple_of=16).shape == (1, 16)


@st.composite
def trajectories(draw: st.DrawFn) -> list[Trajectory]:
    out = []
    for i in range(draw(st.integers(1, 6))):
        segs: list[Segment] = [prompt(draw(st.lists(st.integers(1, 99), min_size=0, max_size=3)))]
        for _ in range(draw(st.integers(1, 3))):
            segs.append(act(draw(st.lists(st.integers(1, 99), min_size=1, max_size=4)), draw(st.integers(0, 5))))
            segs.append(obs(draw(st.lists(st.integers(1, 99), min_size=0, max_size=4))))
        out.append(Trajectory(f"task{i % 2}", "e", tuple(segs), draw(st.floats(-1, 1))))
    return out


@settings(max_examples=50, deadline=None)
@given(trajectories(), st.integers(0, 2**31))
def test_pack_holds_the_same_tokens_and_gae_matches_padded_rows(trajs: list[Trajectory], seed: int) -> None:
    padded = collate(trajs, pad_token_id=PAD)
    max_len = max(t.num_tokens for t in trajs) + 3
    packed = pack(trajs, pad_token_id=PAD, max_len=max_len)
    assert packed.shape[1] <= max_len and packed.shape[0] <= len(trajs)
    # every token of every trajectory, once, with positions restarting per sequence
    real = packed.attention_mask.bool()
    assert int(real.sum()) == sum(t.num_tokens for t in trajs)
    cu = packed.cu_seqlens.tolist()
    flat_ids = packed.input_ids[real]
    flat_seq = packed.seq_ids[real]
    flat_pos = packed.position_ids[real]
    for k in range(len(trajs)):
        s = flat_seq[cu[k]].item()
        assert flat_seq[cu[k] : cu[k + 1]].eq(s).all()
        assert flat_ids[cu[k] : cu[k + 1]].tolist() == trajs[s].token_ids
        assert flat_pos[cu[k] : cu[k + 1]].tolist() == list(range(cu[k + 1] - cu[k]))
    # GAE on packed rows with seq_ids == GAE on padded rows, token by token
    g = torch.Generator().manual_seed(seed)
    values_padded = torch.randn(padded.shape, generator=g, dtype=torch.float64)
    adv_p, ret_p = skip_observation_gae(padded.rewards.double(), values_padded, padded.action_mask, 0.95, 0.9)
    values_packed = torch.zeros(packed.shape, dtype=torch.float64)
    values_packed[real] = torch.cat(
        [values_padded[s, : trajs[s].num_tokens] for s in (flat_seq[cu[k]].item() for k in range(len(trajs)))]
    )
    adv_k, _ = skip_observation_gae(
        packed.rewards.double(), values_packed, packed.action_mask, 0.95, 0.9, seq_ids=packed.seq_ids
    )
    for k in range(len(trajs)):
        s = int(flat_seq[cu[k]].item())
        n = trajs[s].num_tokens
        torch.testing.assert_close(adv_k[real][cu[k] : cu[k + 1]], adv_p[s, :n], rtol=1e-9, atol=1e-12)
    assert bool((ret_p[~padded.action_mask] == 0).all())
    assert int(packed.action_mask.sum()) == int(padded.action_mask.sum())
