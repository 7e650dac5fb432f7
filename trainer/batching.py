"""The learner's view of a batch: the ``[B, T]`` tensors of ``trainer.batch.collate`` it uses, row-sliceable."""

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


def collate(trajs: list[Trajectory], pad_token_id: int) -> TrainBatch:
    """``trainer.batch.collate`` (one right-padded row per trajectory, reward on the last action token)."""
    from trainer.batch import collate as core_collate

    b = core_collate(trajs, pad_token_id)
    return TrainBatch(
        b.input_ids,
        b.attention_mask,
        b.action_mask.bool(),
        b.rollout_logprobs.float(),
        b.rewards.float(),
        b.position_ids,
    )
