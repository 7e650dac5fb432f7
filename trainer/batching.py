"""Trajectories -> padded ``[B, T]`` tensors for the learner (``trainer.batch.collate`` when present)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agent.records import Trajectory


@dataclass(frozen=True)
class TrainBatch:
    """Right-padded rows, one trajectory each. ``rewards`` sits on the last token of each action segment;
    ``rollout_logprobs`` on action tokens (0 elsewhere); ``policy_version`` per action token (-1 elsewhere)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    rewards: torch.Tensor
    position_ids: torch.Tensor

    def rows(self, idx: list[int]) -> TrainBatch:
        sel = torch.tensor(idx, dtype=torch.long)
        return TrainBatch(*(getattr(self, f).index_select(0, sel) for f in _FIELDS))


_FIELDS = ("input_ids", "attention_mask", "action_mask", "rollout_logprobs", "rewards", "position_ids")


def _own_collate(trajs: list[Trajectory], pad_token_id: int) -> TrainBatch:
    t_max = max(1, max(t.num_tokens for t in trajs))
    b = len(trajs)
    ids = torch.full((b, t_max), pad_token_id, dtype=torch.long)
    attn = torch.zeros((b, t_max), dtype=torch.long)
    act = torch.zeros((b, t_max), dtype=torch.bool)
    lp = torch.zeros((b, t_max), dtype=torch.float32)
    rew = torch.zeros((b, t_max), dtype=torch.float32)
    for i, tr in enumerate(trajs):
        pos = 0
        last_action_end = -1
        for seg in tr.segments:
            n = len(seg.token_ids)
            ids[i, pos : pos + n] = torch.tensor(seg.token_ids, dtype=torch.long)
            if seg.kind == "action" and n:
                act[i, pos : pos + n] = True
                lp[i, pos : pos + n] = torch.tensor(seg.logprobs or (), dtype=torch.float32)
                if seg.reward is not None:
                    rew[i, pos + n - 1] += float(seg.reward)
                last_action_end = pos + n - 1
            pos += n
        attn[i, :pos] = 1
        seg_rewards = sum(float(s.reward or 0.0) for s in tr.action_segments)
        # Envs that only report a trajectory reward: it goes on the last action token.
        if last_action_end >= 0 and abs(seg_rewards - tr.reward) > 1e-9:
            rew[i, last_action_end] += tr.reward - seg_rewards
    pos_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    return TrainBatch(ids, attn, act, lp, rew, pos_ids)


def collate(trajs: list[Trajectory], pad_token_id: int) -> TrainBatch:
    """Use the core-math helper's ``trainer.batch.collate`` when it exists, else the local one."""
    try:
        from trainer.batch import collate as core_collate  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return _own_collate(trajs, pad_token_id)
    b = core_collate(trajs, pad_token_id)
    return TrainBatch(
        b.input_ids,
        b.attention_mask,
        b.action_mask.bool(),
        b.rollout_logprobs.float(),
        b.rewards.float(),
        b.position_ids,
    )
