"""Trajectories -> a padded ``Batch`` of ``[B, T]`` tensors, token-exact, ready for the trainer.

One trajectory per row, right-padded to the longest one: the model's own causal attention plus ``attention_mask``
is all it needs, with every attention implementation. Nothing here builds a ``[B, T, T]`` mask: memory is O(B*T).
Rewards sit where they were earned: each action segment's ``reward`` on that turn's last action token, and the
rest of the episode's total (``Trajectory.reward`` minus what the turns carry) on the last action token, so the
token rewards of a row always sum to the trajectory's reward.

The micro batches of a global batch live here too: ``shard_batch`` (planned by ``micro_rows``: a token budget, or
the plain row cut) cuts it into this rank's micro batches, ``shard_like`` cuts a tensor of the whole batch the same
way, and ``token_scale`` weights their losses so that accumulation over micro batches and ranks equals one
token-mean over the whole batch, however it was cut.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from sao.agent.records import Trajectory
from sao.trainer import distributed as dist_utils
from sao.trainer.config import DeepSpeedConfig


@dataclass(frozen=True)
class Batch:
    """Tensors of one training batch, one trajectory per row: ``[B, T]`` unless said otherwise.

    input_ids (long, ``pad_token_id`` on padding); attention_mask (long 1/0); position_ids (long, from 0, 0 on
    padding); action_mask (bool, True only on action tokens); response_mask (bool, action and observation tokens:
    what token-level ``gae`` runs over); rollout_logprobs (float32, the engine's sampling logprob, 0 off actions;
    may hold -inf/NaN from a faulty engine: the learner masks those tokens); rewards (float32: each turn's reward
    on its last action token, the rest of the trajectory reward on the last action token); group_ids (long ``[B]``:
    ``Trajectory.group_id``, or a group of its own for a trajectory without one); episode_ids (long ``[B]``: the
    episode of each row: the rows of one episode share its outcome, and a group baseline counts it once); bootstrap
    (bool ``[B]``: the
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
    episode_ids: torch.Tensor
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


def _build(
    flats: list[_Flat], width: int, pad_token_id: int, trajectories: Sequence[Trajectory], episodes: Sequence[int]
) -> Batch:
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
        episode_ids=torch.tensor(list(episodes), dtype=torch.long),
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
    episodes: Sequence[int] | None = None,
) -> Batch:
    """One trajectory per row, right-padded to the longest (rounded up to ``pad_to_multiple_of``). ``episodes``:
    the episode of each row (None: every row an episode of its own).

    A trajectory longer than ``max_len``, one with ``status="infra_error"``, a non-finite reward or no action
    tokens is refused with a ValueError (truncating would silently move its reward).
    """
    if not trajectories:
        raise ValueError("cannot batch an empty list of trajectories")
    if episodes is not None and len(episodes) != len(trajectories):
        raise ValueError(f"collate got {len(episodes)} episode ids for {len(trajectories)} trajectories; give one each")
    flats = [_flatten(t, i) for i, t in enumerate(trajectories)]
    _check_lengths(flats, trajectories, max_len)
    width = max(len(f.ids) for f in flats)
    width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    return _build(flats, width, pad_token_id, trajectories, range(len(flats)) if episodes is None else episodes)


# -- micro batches ------------------------------------------------------------------------------------------


def micro_rows(
    lengths: Sequence[int], world: int, micro_batch_size: int, micro_batch_tokens: int
) -> list[list[list[int]]]:
    """Every rank's micro batches as rows of the global batch (``[rank][micro] -> rows``), from the row lengths
    alone, so every rank computes the same plan without talking to the others.

    ``micro_batch_tokens == 0``, the row cut: rank r takes rows r, r + world, ... in chunks of ``micro_batch_size``.
    Otherwise the token budget: rows go to the ranks longest first, each to the rank holding the fewest tokens so
    far; on each rank, longest first, a micro batch takes rows while ``rows x its longest row`` stays within
    ``micro_batch_tokens`` and ``rows`` within ``micro_batch_size``. Either way a rank with fewer micro batches than
    another gets empty ones (``[]``) at the end: the accumulation boundary, where the ranks reduce gradients, must
    fall on the same micro batch on every rank.
    """
    if world < 1 or micro_batch_size < 1 or micro_batch_tokens < 0:
        raise ValueError("world and micro_batch_size must be >= 1, micro_batch_tokens >= 0")
    if micro_batch_tokens == 0:
        mine = [list(range(r, len(lengths), world)) for r in range(world)]
        plans = [[m[i : i + micro_batch_size] for i in range(0, len(m), micro_batch_size)] for m in mine]
    else:
        per_rank: list[list[int]] = [[] for _ in range(world)]
        load = [0] * world
        for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
            r = min(range(world), key=lambda k: (load[k], len(per_rank[k]), k))
            per_rank[r].append(i)
            load[r] += lengths[i]
        plans = [_pack(rows, lengths, micro_batch_size, micro_batch_tokens) for rows in per_rank]
    n = max(len(p) for p in plans)
    return [p + [[] for _ in range(n - len(p))] for p in plans]


def _pack(rows: list[int], lengths: Sequence[int], max_rows: int, budget: int) -> list[list[int]]:
    """Rows sorted longest first into micro batches: each is padded to its first row, so it fits while
    ``(rows + 1) x lengths[first] <= budget``."""
    out: list[list[int]] = []
    for i in rows:
        if out and len(out[-1]) < max_rows and (len(out[-1]) + 1) * lengths[out[-1][0]] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _cuts(full: Batch, d: DeepSpeedConfig) -> list[tuple[list[int], int]]:
    """This rank's micro batches as ``(rows, width)``: the row cut keeps the batch's width, the token budget pads
    each micro batch to its own longest row; an empty one is one token wide."""
    lengths = full.lengths
    plan = micro_rows(lengths, dist_utils.world_size(), d.micro_batch_size, d.micro_batch_tokens)
    mine = plan[dist_utils.rank()]
    if d.micro_batch_tokens == 0:
        return [(rows, full.shape[1] if rows else 1) for rows in mine]
    return [(rows, max((lengths[i] for i in rows), default=1)) for rows in mine]


def shard_batch(full: Batch, d: DeepSpeedConfig) -> list[Batch]:
    """This rank's micro batches of a global batch (``micro_rows`` with ``deepspeed.micro_batch_size`` /
    ``micro_batch_tokens``), on the device. An empty micro batch is one attended token of row 0 with nothing to
    train (no action or response token, no reward): it runs forward and backward like the others, so collective
    ops inside them (ZeRO-3 gathers, gradient reduction) match across ranks, and adds exactly zero gradient."""
    dev = dist_utils.device()
    out = []
    for rows, width in _cuts(full, d):
        if rows:
            out.append(full.rows(rows).columns(width).to(dev))
            continue
        one = full.rows([0]).columns(1)
        off = torch.zeros_like(one.action_mask)
        idle = replace(one, action_mask=off, response_mask=off, rewards=torch.zeros_like(one.rewards),
                       rollout_logprobs=torch.zeros_like(one.rollout_logprobs))  # fmt: skip
        out.append(idle.to(dev))
    return out


def shard_like(t: torch.Tensor, full: Batch, d: DeepSpeedConfig) -> list[torch.Tensor]:
    """A ``[B, T]`` tensor of the global batch (e.g. advantages computed over all of it) cut exactly as
    ``shard_batch`` cuts ``full``, on the device; zeros on an empty micro batch."""
    dev = dist_utils.device()
    return [(t[rows, :width] if rows else t.new_zeros((1, 1))).to(dev) for rows, width in _cuts(full, d)]


def micro_batch_rows(full: Batch, d: DeepSpeedConfig) -> list[list[int]]:
    """The rows of the global batch in each of this rank's micro batches (``shard_batch``'s order; ``[]`` for an
    empty one): row ``j`` of micro batch ``i`` is row ``micro_batch_rows(...)[i][j]`` of ``full``."""
    return [rows for rows, _ in _cuts(full, d)]


def token_scale(masks: list[torch.Tensor], grad_accum: int) -> tuple[float, float]:
    """``(n_total, scale)``: the masked tokens over all ranks (0 when there is nothing to train), and the factor
    that turns a micro batch's token-mean loss times its token count into its share of one global token-mean
    (DeepSpeed averages over accumulation steps and ranks, which the factor undoes)."""
    n_total = dist_utils.all_reduce_sum([float(sum(float(m.sum()) for m in masks))])[0]
    return n_total, grad_accum * dist_utils.world_size() / max(n_total, 1.0)
