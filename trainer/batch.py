"""Trajectories -> a padded (or packed) ``Batch`` of ``[B, T]`` tensors, token-exact, ready for the trainer.

Two layouts, same fields:

* ``collate``: one trajectory per row, right-padded to the longest one. Works with every attention
  implementation; the model's own causal attention plus ``attention_mask`` is all it needs.
* ``pack``: whole trajectories placed back to back in rows of at most ``max_len`` tokens (first-fit
  decreasing), ``position_ids`` restarting at 0 at each sequence, ``seq_ids`` naming the trajectory of every
  token and ``cu_seqlens`` the sequence boundaries. How to consume it: take the real tokens
  ``x[attention_mask.bool()]`` (sequences end to end, in ``cu_seqlens`` order) as one ``[1, N]`` row with its
  ``position_ids``; a flash-attention varlen kernel (HF ``attn_implementation="flash_attention_2"`` detects
  the restarts in ``position_ids``) then never attends across sequences. Eager/SDPA attention would attend
  across them: on CPU use ``collate``. Pass ``seq_ids`` to ``skip_observation_gae`` so the recursion restarts
  at every sequence.

Nothing here builds a ``[B, T, T]`` mask: memory is O(B*T); causality is the model's job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from agent.records import Trajectory


@dataclass(frozen=True)
class Batch:
    """Tensors of one training batch; ``[B, T]`` unless said otherwise (``B`` rows, ``N`` trajectories).

    input_ids (long, ``pad_token_id`` on padding); attention_mask (long 1/0); position_ids (long, from 0 at each
    sequence start, 0 on padding); action_mask (bool, True only on action tokens); response_mask (bool, action
    and observation tokens: what token-level ``gae`` runs over); rollout_logprobs (float32, the engine's
    sampling logprob, 0 off actions); rewards (float32: the trajectory reward on its last action token, plus
    per-turn rewards on each turn's last action token when asked for); turn_ids (long, index of the action turn
    within its trajectory, -1 off actions); policy_version (long, weights version that sampled the token, -1 off
    actions); seq_ids (long, index of the token's trajectory in the input list, -1 on padding);
    cu_seqlens (int32 ``[N + 1]``, boundaries of the sequences in ``x[attention_mask.bool()]`` order);
    group_ids (long ``[N]``, trajectories of the same ``task_id`` share a group, for GRPO);
    seq_rewards (float32 ``[N]``, the trajectory rewards).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    action_mask: torch.Tensor
    response_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    rewards: torch.Tensor
    turn_ids: torch.Tensor
    policy_version: torch.Tensor
    seq_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    group_ids: torch.Tensor
    seq_rewards: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.input_ids.shape[0]), int(self.input_ids.shape[1]))

    @property
    def num_action_tokens(self) -> int:
        return int(self.action_mask.sum())

    def to(self, device: torch.device | str) -> Batch:
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)})


@dataclass
class _Flat:
    """One trajectory as per-token Python lists."""

    ids: list[int]
    action: list[bool]
    response: list[bool]
    logprobs: list[float]
    rewards: list[float]
    turns: list[int]
    versions: list[int]


def _flatten(traj: Trajectory, index: int, per_turn_rewards: bool) -> _Flat:
    where = f"trajectory {index} (task {traj.task_id!r})"
    if traj.status == "infra_error":
        raise ValueError(f"{where} has status='infra_error': infra failures are never trained on; filter them out")
    if not math.isfinite(traj.reward):
        raise ValueError(f"{where} has a non-finite reward {traj.reward!r}")
    f = _Flat([], [], [], [], [], [], [])
    last_action_pos = -1
    turn = 0
    for seg in traj.segments:
        n = len(seg.token_ids)
        is_action = seg.kind == "action"
        f.ids.extend(seg.token_ids)
        f.action.extend([is_action] * n)
        f.response.extend([seg.kind != "prompt"] * n)
        f.rewards.extend([0.0] * n)
        if is_action:
            assert seg.logprobs is not None and seg.policy_version is not None  # Segment enforces both
            f.logprobs.extend(seg.logprobs)
            f.turns.extend([turn] * n)
            f.versions.extend([seg.policy_version] * n)
            if n:
                last_action_pos = len(f.ids) - 1
            if per_turn_rewards and seg.reward is not None:
                if last_action_pos < 0:
                    raise ValueError(f"{where}: turn {turn} has a reward but no action token to carry it")
                f.rewards[last_action_pos] += float(seg.reward)
            turn += 1
        else:
            f.logprobs.extend([0.0] * n)
            f.turns.extend([-1] * n)
            f.versions.extend([-1] * n)
    if last_action_pos < 0:
        raise ValueError(f"{where} has no action tokens: nothing to train on; filter it out")
    f.rewards[last_action_pos] += float(traj.reward)
    return f


def _build(
    flats: list[_Flat], rows: list[list[int]], width: int, pad_token_id: int, trajectories: Sequence[Trajectory]
) -> Batch:
    """Lay out ``flats`` as ``rows`` (lists of trajectory indices, placed left to right) of ``width`` tokens."""
    b = len(rows)
    shape = (b, width)
    input_ids = torch.full(shape, int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros(shape, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    action_mask = torch.zeros(shape, dtype=torch.bool)
    response_mask = torch.zeros(shape, dtype=torch.bool)
    logprobs = torch.zeros(shape, dtype=torch.float32)
    rewards = torch.zeros(shape, dtype=torch.float32)
    turn_ids = torch.full(shape, -1, dtype=torch.long)
    versions = torch.full(shape, -1, dtype=torch.long)
    seq_ids = torch.full(shape, -1, dtype=torch.long)
    lengths: list[int] = []
    for r, members in enumerate(rows):
        off = 0
        for i in members:
            f = flats[i]
            n = len(f.ids)
            s = slice(off, off + n)
            input_ids[r, s] = torch.tensor(f.ids, dtype=torch.long)
            attention_mask[r, s] = 1
            position_ids[r, s] = torch.arange(n)
            action_mask[r, s] = torch.tensor(f.action, dtype=torch.bool)
            response_mask[r, s] = torch.tensor(f.response, dtype=torch.bool)
            logprobs[r, s] = torch.tensor(f.logprobs, dtype=torch.float32)
            rewards[r, s] = torch.tensor(f.rewards, dtype=torch.float32)
            turn_ids[r, s] = torch.tensor(f.turns, dtype=torch.long)
            versions[r, s] = torch.tensor(f.versions, dtype=torch.long)
            seq_ids[r, s] = i
            lengths.append(n)
            off += n
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    task_index: dict[str, int] = {}
    group_ids = torch.tensor([task_index.setdefault(t.task_id, len(task_index)) for t in trajectories])
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        action_mask=action_mask,
        response_mask=response_mask,
        rollout_logprobs=logprobs,
        rewards=rewards,
        turn_ids=turn_ids,
        policy_version=versions,
        seq_ids=seq_ids,
        cu_seqlens=cu,
        group_ids=group_ids,
        seq_rewards=torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32),
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


def _flatten_all(trajectories: Sequence[Trajectory], per_turn_rewards: bool) -> list[_Flat]:
    if not trajectories:
        raise ValueError("cannot batch an empty list of trajectories")
    return [_flatten(t, i, per_turn_rewards) for i, t in enumerate(trajectories)]


def collate(
    trajectories: Sequence[Trajectory],
    pad_token_id: int,
    max_len: int | None = None,
    per_turn_rewards: bool = False,
    pad_to_multiple_of: int = 1,
) -> Batch:
    """One trajectory per row, right-padded to the longest (rounded up to ``pad_to_multiple_of``).

    A trajectory longer than ``max_len``, one with ``status="infra_error"`` or one without action tokens is
    refused with a ValueError (truncating would silently move its reward).
    """
    flats = _flatten_all(trajectories, per_turn_rewards)
    _check_lengths(flats, trajectories, max_len)
    width = max(len(f.ids) for f in flats)
    width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    return _build(flats, [[i] for i in range(len(flats))], width, pad_token_id, trajectories)


def pack(
    trajectories: Sequence[Trajectory],
    pad_token_id: int,
    max_len: int,
    per_turn_rewards: bool = False,
) -> Batch:
    """Pack whole trajectories into as few rows of at most ``max_len`` tokens as first-fit decreasing finds.

    A trajectory is never split across rows. See the module docstring for how the trainer consumes the result.
    """
    flats = _flatten_all(trajectories, per_turn_rewards)
    _check_lengths(flats, trajectories, max_len)
    order = sorted(range(len(flats)), key=lambda i: -len(flats[i].ids))
    rows: list[list[int]] = []
    fill: list[int] = []
    for i in order:
        n = len(flats[i].ids)
        for r, used in enumerate(fill):
            if used + n <= max_len:
                rows[r].append(i)
                fill[r] += n
                break
        else:
            rows.append([i])
            fill.append(n)
    return _build(flats, rows, max(fill), pad_token_id, trajectories)
