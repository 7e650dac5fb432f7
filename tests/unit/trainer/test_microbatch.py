"""Micro batches by a token budget (``sao.trainer.learn.batch.micro_rows`` / ``shard_batch``): the plan's
invariants, the row cut it replaces, empty micro batches that keep ranks in step, and a gradient equal to the unsplit
batch's."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

from sao.agent.records import Segment, Trajectory
from sao.trainer import distributed as dist_utils
from sao.trainer.algos.losses import value_loss
from sao.trainer.config import ConfigError, DeepSpeedConfig, config_from_dict
from sao.trainer.learn.batch import Batch, collate, micro_rows, shard_batch, shard_like, token_scale
from sao.trainer.learn.learner import critic_step


def _plan_rows(plan: list[list[list[int]]]) -> list[int]:
    return sorted(i for rank in plan for micro in rank for i in micro)


def test_the_row_cut_is_the_old_cut() -> None:
    plan = micro_rows([5, 9, 2, 7, 3, 8, 1, 4], world=2, micro_batch_size=3, micro_batch_tokens=0)
    assert plan == [[[0, 2, 4], [6]], [[1, 3, 5], [7]]]


@pytest.mark.parametrize("seed", range(40))
def test_token_budget_plan_invariants(seed: int) -> None:
    rng = random.Random(seed)
    n, world = rng.randint(1, 40), rng.choice([1, 2, 3, 4])
    lengths = [int(rng.paretovariate(1.2) * 300) for _ in range(n)]  # heavy-tailed, like SWE episodes
    mbs, budget = rng.randint(1, 16), rng.choice([500, 2000, 8000])
    plan = micro_rows(lengths, world, mbs, budget)
    assert len(plan) == world
    assert len({len(p) for p in plan}) == 1, "every rank must run the same number of micro batches"
    assert _plan_rows(plan) == list(range(n)), "every row exactly once"
    for rank in plan:
        real = [m for m in rank if m]
        assert rank[: len(real)] == real, "empty micro batches only at the end"
        for m in real:
            widths = [lengths[i] for i in m]
            assert widths == sorted(widths, reverse=True)
            assert len(m) <= mbs
            assert len(m) == 1 or len(m) * widths[0] <= budget, "over budget with more than one row"
    # greedy balance by tokens: no rank holds more than the lightest one plus one row
    loads = [sum(lengths[i] for m in rank for i in m) for rank in plan]
    assert max(loads) - min(loads) <= max(lengths)


def test_a_rank_with_fewer_micro_batches_gets_empty_ones() -> None:
    # rank 0 takes the 1000-token row alone; rank 1's two 600-token rows overflow a 1100-token budget together
    plan = micro_rows([1000, 600, 600], world=2, micro_batch_size=8, micro_batch_tokens=1100)
    assert plan == [[[0], []], [[1], [2]]]


def test_the_budget_packs_short_rows_and_isolates_long_ones() -> None:
    lengths = [3000, 300, 320, 310, 2900, 305]
    plan = micro_rows(lengths, world=1, micro_batch_size=8, micro_batch_tokens=4096)
    assert plan == [[[0], [4], [2, 3, 5, 1]]]
    padded = sum(len(m) * max(lengths[i] for i in m) for m in plan[0])
    assert padded == 3000 + 2900 + 4 * 320  # vs 6 x 3000 for the row cut of one micro batch


def test_bad_plan_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="micro_batch_size"):
        micro_rows([1], world=1, micro_batch_size=0, micro_batch_tokens=0)
    with pytest.raises(ConfigError, match=r"deepspeed\.micro_batch_tokens must be >= 0"):
        config_from_dict({"deepspeed": {"micro_batch_tokens": -1}})


# -- on real batches ---------------------------------------------------------------------------------------------

VOCAB = 64


def _trajectories(lengths: list[tuple[int, int, int]], seed: int = 0) -> list[Trajectory]:
    """One multi-turn trajectory per ``(prompt, observation, action)`` size: prompt, action, observation, action."""
    rng = random.Random(seed)

    def ids(k: int) -> tuple[int, ...]:
        return tuple(rng.randrange(1, VOCAB) for _ in range(k))

    out = []
    for i, (p, o, a) in enumerate(lengths):
        segs = (
            Segment("prompt", ids(p)),
            Segment("action", ids(a), tuple(-1.0 for _ in range(a)), 0, 0.0),
            Segment("observation", ids(o)),
            Segment("action", ids(a), tuple(-1.0 for _ in range(a)), 0, float(i % 2)),
        )
        out.append(Trajectory(f"t{i}", "test", segs, float(i % 2)))
    return out


UNEVEN = [(4, 30, 3), (2, 2, 2), (6, 12, 5), (3, 1, 1), (5, 40, 4), (2, 6, 3), (8, 3, 2)]


@pytest.fixture()
def at_rank(monkeypatch: pytest.MonkeyPatch) -> Callable[[int, int], None]:
    """``at_rank(rank, world)``: cut as that rank of that many would (no process group needed)."""
    where = [0, 1]
    monkeypatch.setattr(dist_utils, "rank", lambda: where[0])
    monkeypatch.setattr(dist_utils, "world_size", lambda: where[1])

    def at(rank: int, world: int) -> None:
        where[:] = [rank, world]

    return at


def test_shard_batch_pads_each_micro_batch_to_its_own_longest_row() -> None:
    full = collate(_trajectories(UNEVEN), pad_token_id=0)
    d = DeepSpeedConfig(micro_batch_size=8, micro_batch_tokens=100)
    micro = shard_batch(full, d)
    plan = micro_rows(full.lengths, 1, 8, 100)[0]
    assert len(micro) == len(plan) > 1
    for b, rows in zip(micro, plan, strict=True):
        width = max(full.lengths[i] for i in rows)
        assert b.shape == (len(rows), width)
        torch.testing.assert_close(b.input_ids, full.input_ids[rows, :width])
        assert bool(b.attention_mask[:, 0].all()) and int(b.attention_mask.sum()) == sum(full.lengths[i] for i in rows)
        assert b.group_ids.tolist() == full.group_ids[rows].tolist()
    assert sum(b.num_action_tokens for b in micro) == full.num_action_tokens
    old = shard_batch(full, DeepSpeedConfig(micro_batch_size=3, micro_batch_tokens=0))
    assert [b.shape for b in old] == [(3, full.shape[1]), (3, full.shape[1]), (1, full.shape[1])]


def test_an_empty_micro_batch_has_nothing_to_train(at_rank: Callable[[int, int], None]) -> None:
    full = collate(_trajectories([(10, 60, 30), (5, 10, 40), (5, 10, 40)]), pad_token_id=0)
    d = DeepSpeedConfig(micro_batch_size=8, micro_batch_tokens=110)
    assert micro_rows(full.lengths, 2, 8, 110) == [[[0], []], [[1], [2]]]
    at_rank(0, 2)
    micro = shard_batch(full, d)
    idle = micro[1]
    assert idle.shape == (1, 1) and int(idle.attention_mask.sum()) == 1
    assert not idle.action_mask.any() and not idle.response_mask.any() and float(idle.rewards.abs().sum()) == 0
    cut = shard_like(torch.ones(full.shape), full, d)
    assert [c.shape for c in cut] == [b.shape for b in micro] and float(cut[1].sum()) == 0.0


class _Accumulator:
    """The part of a ZeRO-0 DeepSpeed engine ``critic_step`` uses: the loss divided by the engine's fixed
    accumulation count before backward (what DeepSpeed does), gradients left in ``p.grad``, boundaries recorded."""

    def __init__(self, module: torch.nn.Module, grad_accum: int) -> None:
        self.module, self.grad_accum, self.boundaries = module, grad_accum, []  # type: list[bool]

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.module(*args)
        return out

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.grad_accum).backward()

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        self.boundaries.append(is_boundary)

    def step(self) -> None:
        return None

    def zero_optimization_stage(self) -> int:
        return 0

    def get_global_grad_norm(self) -> None:
        return None


def _critic() -> torch.nn.Module:
    from sao.core.tiny_models import build_tiny_model
    from sao.trainer.learn.models import ValueModel

    lm = build_tiny_model("llama", seed=0, vocab_size=VOCAB)
    torch.manual_seed(1)
    return ValueModel(lm.model, lm.config.hidden_size)


def _grads(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {k: p.grad.detach().clone() for k, p in m.named_parameters() if p.grad is not None}
    m.zero_grad(set_to_none=True)
    return out


def _returns(b: Batch) -> torch.Tensor:
    return torch.where(b.action_mask, torch.linspace(-1, 1, b.shape[1]).expand(b.shape), 0.0)


@pytest.mark.parametrize(("world", "budget"), [(1, 60), (2, 60), (2, 0)])
def test_the_gradient_equals_the_unsplit_unsorted_batch(
    at_rank: Callable[[int, int], None], world: int, budget: int
) -> None:
    from sao.trainer.learn.models import shifted_values

    critic = _critic()
    full = collate(_trajectories(UNEVEN), pad_token_id=0)
    rets_full = _returns(full)
    # the reference: one token-mean of the value loss over the whole batch, in its own order, one backward
    values = shifted_values(critic(full.input_ids, full.attention_mask, full.position_ids))
    loss, _ = value_loss(values, values.detach(), rets_full, full.action_mask, None)
    loss.backward()
    ref = _grads(critic)

    d = DeepSpeedConfig(micro_batch_size=3, micro_batch_tokens=budget)
    grad_accum = 2  # the engine's fixed count; token_scale undoes it whatever the number of micro batches
    n_total = float(full.action_mask.sum())  # what token_scale's all-reduce over the ranks gives
    got: dict[str, torch.Tensor] = {}
    counts = []
    for rank in range(world):
        at_rank(rank, world)
        micro = shard_batch(full, d)
        counts.append(len(micro))
        eng = _Accumulator(critic, grad_accum)
        masks = [b.action_mask for b in micro]
        critic_step(eng, micro, masks, shard_like(rets_full, full, d), None, None, grad_accum * world / n_total)
        assert eng.boundaries == [False] * (len(micro) - 1) + [True]
        for k, g in _grads(critic).items():
            got[k] = got.get(k, torch.zeros_like(g)) + g / world  # the ranks' gradients are averaged
    assert len(set(counts)) == 1 and (budget == 0 or counts[0] > 1)
    assert set(got) == set(ref)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)


def test_token_scale_is_the_global_token_mean_factor() -> None:
    masks = [torch.ones(2, 3, dtype=torch.bool), torch.zeros(1, 1, dtype=torch.bool)]
    assert token_scale(masks, grad_accum=4) == (6.0, 4 / 6.0)
