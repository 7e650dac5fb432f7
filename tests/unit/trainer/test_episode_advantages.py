"""Outcome baselines count episodes, not rows: an episode with several rows (a harness's prefix breaks) shares its one
advantage (issue 44 item 1)."""

from __future__ import annotations

import pytest
import torch

from sao.agent.records import Segment, Trajectory
from sao.trainer.algos.advantages import RunningMeanBaseline
from sao.trainer.algos.registry import AdvantageInputs, get_advantage
from sao.trainer.learn.batch import collate
from sao.trainer.rollout.pipeline import Item
from sao.trainer.runs.commands import Train


def _row(reward: float, group: int) -> Trajectory:
    segs = (Segment("prompt", (1,)), Segment("action", (2, 3), (-0.1, -0.1), 0))
    return Trajectory("t", "s", segs, reward, group_id=group)


def _inputs(rows: list[Trajectory], episodes: list[int], **kw: object) -> AdvantageInputs:
    b = collate(rows, 0, episodes=episodes)
    return AdvantageInputs(rewards=b.rewards, action_mask=b.action_mask, group_ids=b.group_ids,
                           episode_ids=b.episode_ids, **kw)  # type: ignore[arg-type]  # fmt: skip


def test_grpo_counts_an_episode_once_however_many_rows_it_has() -> None:
    # one group of two episodes: A (3 rows, solved) and B (1 row, failed); counting rows gave a group mean of 0.75
    rows = [_row(1.0, 0), _row(1.0, 0), _row(1.0, 0), _row(0.0, 0)]
    adv, _ = get_advantage("grpo")(_inputs(rows, [0, 0, 0, 1]))
    per_row = adv.sum(dim=1) / 2  # two action tokens a row
    expected = 0.5 / (2**-0.5 + 1e-6)  # (R - mean) / (unbiased std) over the episodes' outcomes [1, 0]
    assert per_row.tolist() == pytest.approx([expected] * 3 + [-expected], rel=1e-5)


def test_running_mean_updates_once_per_episode() -> None:
    base = RunningMeanBaseline()
    rows = [_row(1.0, 0), _row(1.0, 0), _row(0.0, 1)]
    adv, _ = get_advantage("running_mean")(_inputs(rows, [0, 0, 1], baseline=base))
    assert base.count == 2 and base.mean == pytest.approx(0.5)
    assert (adv.sum(dim=1) / 2).tolist() == pytest.approx([0.5, 0.5, -0.5])


def test_train_command_names_each_rows_episode() -> None:
    a, b = Item(["u0", "u1"], [_row(1.0, 0), _row(1.0, 0)]), Item(["u2"], [_row(0.0, 0)])
    cmd = Train.of([a, b])
    assert len(cmd.trajs) == 3 and cmd.episodes == (0, 0, 1)
    assert collate(list(cmd.trajs), 0, episodes=cmd.episodes).episode_ids.tolist() == [0, 0, 1]
    assert torch.equal(collate(list(cmd.trajs), 0).episode_ids, torch.arange(3))  # no ids: a row each
