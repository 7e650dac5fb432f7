"""Trajectories -> a padded ``Batch`` of ``[B, T]`` tensors, token-exact, ready for the trainer.

One trajectory per row, right-padded to the longest one: the model's own causal attention plus ``attention_mask``
is all it needs, with every attention implementation. Nothing here builds a ``[B, T, T]`` mask: memory is O(B*T).
Rewards sit where they were earned: each action segment's ``reward`` on that turn's last action token, and the
rest of the episode's total (``Trajectory.reward`` minus what the turns carry) on the last action token, so the
token rewards of a row always sum to the trajectory's reward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from sao.agent.records import Trajectory


@dataclass(frozen=True)
class Batch:
    """Tensors of one training batch, one trajectory per row: ``[B, T]`` unless said otherwise.

    input_ids (long, ``pad_token_id`` on padding); attention_mask (long 1/0); position_ids (long, from 0, 0 on
    padding); action_mask (bool, True only on action tokens); response_mask (bool, action and observation tokens:
    what token-level ``gae`` runs over); rollout_logprobs (float32, the engine's sampling logprob, 0 off actions;
    may hold -inf/NaN from a faulty engine: the learner masks those tokens); rewards (float32: each turn's reward
    on its last action token, the rest of the trajectory reward on the last action token); group_ids (long ``[B]``:
    ``Trajectory.group_id``, or a group of its own for a trajectory without one); bootstrap (bool ``[B]``: the
    episode's return is incomplete, a cut nothing graded (``Trajectory.bootstraps``), so GAE bootstraps from V of
    the state after the row's last token; False for every complete return: terminated, a graded cut, a
    format-error ending).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    action_mask: torch.Tensor
    response_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    bootstrap: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.input_ids.shape[0]), int(self.input_ids.shape[1]))

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum())

    def to(self, device: torch.device | str) -> Batch:
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def rows(self, idx: Sequence[int]) -> Batch:
        """The sub-batch of rows ``idx`` (e.g. one rank's micro batch), in that order."""
        sel = torch.tensor(list(idx), dtype=torch.long)
        return replace(self, **{f.name: getattr(self, f.name).index_select(0, sel) for f in fields(self)})

    @property
    def lengths(self) -> list[int]:
        """Tokens of each row (rows are right-padded, so row ``i`` is real up to ``lengths[i]``)."""
        return [int(n) for n in self.attention_mask.sum(-1).tolist()]

    def columns(self, width: int) -> Batch:
        """The first ``width`` tokens of every row: with ``width`` >= the longest row, only padding is cut."""
        cut = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(self, **{k: v[:, :width] for k, v in cut.items() if v.dim() == 2})  # [B] fields stay whole


@dataclass
class _Flat:
    """One trajectory as per-token Python lists."""

    ids: list[int]
    action: list[bool]
    response: list[bool]
    logprobs: list[float]
    rewards: list[float]


def _flatten(traj: Trajectory, index: int) -> _Flat:
    where = f"trajectory {index} (task {traj.task_id!r})"
    if traj.status == "infra_error":
        raise ValueError(f"{where} has status='infra_error': infra failures are never trained on; filter them out")
    turn_rewards = [s.reward for s in traj.action_segments if s.reward is not None]
    if not all(math.isfinite(x) for x in [traj.reward, *turn_rewards]):
        raise ValueError(f"{where} has a non-finite reward; drop it before batching (the learner counts these)")
    f = _Flat([], [], [], [], [])
    last_action_pos = -1
    for turn, seg in enumerate(traj.segments):
        n = len(seg.token_ids)
        is_action = seg.kind == "action"
        f.ids.extend(seg.token_ids)
        f.action.extend([is_action] * n)
        f.response.extend([seg.kind != "prompt"] * n)
        f.rewards.extend([0.0] * n)
        if not is_action:
            f.logprobs.extend([0.0] * n)
            continue
        assert seg.logprobs is not None  # Segment enforces it on actions
        f.logprobs.extend(seg.logprobs)
        if n:
            last_action_pos = len(f.ids) - 1
        if seg.reward:
            if last_action_pos < 0:
                raise ValueError(f"{where}: segment {turn} has a reward but no action token to carry it")
            f.rewards[last_action_pos] += float(seg.reward)
    if last_action_pos < 0:
        raise ValueError(f"{where} has no action tokens: nothing to train on; filter it out")
    f.rewards[last_action_pos] += float(traj.reward) - sum(turn_rewards)
    return f


def _build(flats: list[_Flat], width: int, pad_token_id: int, trajectories: Sequence[Trajectory]) -> Batch:
    shape = (len(flats), width)
    input_ids = torch.full(shape, int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    action_mask = torch.zeros(shape, dtype=torch.bool)
    response_mask = torch.zeros(shape, dtype=torch.bool)
    logprobs = torch.zeros(shape, dtype=torch.float32)
    rewards = torch.zeros(shape, dtype=torch.float32)
    for r, f in enumerate(flats):
        s = slice(0, len(f.ids))
        input_ids[r, s] = torch.tensor(f.ids, dtype=torch.long)
        attention_mask[r, s] = 1
        position_ids[r, s] = torch.arange(len(f.ids))
        action_mask[r, s] = torch.tensor(f.action, dtype=torch.bool)
        response_mask[r, s] = torch.tensor(f.response, dtype=torch.bool)
        logprobs[r, s] = torch.tensor(f.logprobs, dtype=torch.float32)
        rewards[r, s] = torch.tensor(f.rewards, dtype=torch.float32)
    # A trajectory without a group id is a group of its own (ids above every real one never collide with them).
    top = max((t.group_id for t in trajectories if t.group_id is not None), default=-1) + 1
    group_ids = torch.tensor([t.group_id if t.group_id is not None else top + i for i, t in enumerate(trajectories)])
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        action_mask=action_mask,
        response_mask=response_mask,
        rollout_logprobs=logprobs,
        rewards=rewards,
        group_ids=group_ids,
        bootstrap=torch.tensor([t.bootstraps for t in trajectories], dtype=torch.bool),
    )


def _check_lengths(flats: list[_Flat], trajectories: Sequence[Trajectory], max_len: int | None) -> None:
    if max_len is None:
        return
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    for i, f in enumerate(flats):
        if len(f.ids) > max_len:
            raise ValueError(
                f"trajectory {i} (task {trajectories[i].task_id!r}) has {len(f.ids)} tokens > max_len={max_len}; "
                "raise max_len or cap the episode length (agent max tokens / max turns) so it fits"
            )


def collate(
    trajectories: Sequence[Trajectory],
    pad_token_id: int,
    max_len: int | None = None,
    pad_to_multiple_of: int = 1,
) -> Batch:
    """One trajectory per row, right-padded to the longest (rounded up to ``pad_to_multiple_of``).

    A trajectory longer than ``max_len``, one with ``status="infra_error"``, a non-finite reward or no action
    tokens is refused with a ValueError (truncating would silently move its reward).
    """
    if not trajectories:
        raise ValueError("cannot batch an empty list of trajectories")
    flats = [_flatten(t, i) for i, t in enumerate(trajectories)]
    _check_lengths(flats, trajectories, max_len)
    width = max(len(f.ids) for f in flats)
    width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    return _build(flats, width, pad_token_id, trajectories)
