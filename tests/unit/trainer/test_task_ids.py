"""One rule names a task (``sao.agent.rollout.task_id_of``): the episode, the trainer's task source, the coordinator's
guard record and the Ray runner's infra errors all give the same id (``task-<index>`` when the record has none)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sao.agent.records import Trajectory
from sao.agent.rollout import Episode, episodes_of, task_id_of
from sao.trainer.cluster.ray_backend import RayRolloutRunner
from sao.trainer.rollout.ledger import Ledger
from sao.trainer.rollout.pipeline import Coordinator, TaskSource

TASKS: list[dict[str, Any]] = [
    {"problem": "1+1"},  # no id: named by its index
    {"task_id": "t", "id": "i"},
    {"instance_id": "repo__pkg-1", "id": "i"},  # instance_id before id
    {"id": "", "problem": "2+2"},  # an empty id is no id
]
WANT = ["task-0", "t", "repo__pkg-1", "task-3"]


def test_task_id_of_and_the_episode_name_a_task_by_one_rule() -> None:
    assert [task_id_of(t, i) for i, t in enumerate(TASKS)] == WANT
    assert [Episode(i, t).tid for i, t in enumerate(TASKS)] == WANT
    assert Episode(7).tid == "task-7" and Episode(7, TASKS[1], task_id="given").tid == "given"
    assert [e.task_id for e in episodes_of(TASKS)] == WANT


def test_the_trainers_task_source_uses_the_rule() -> None:
    source = TaskSource(TASKS, seed=0)
    assert [source.get(i)[2] for i in range(4)] == WANT
    assert source.get(5)[2] == "t", "task 5 is the second record again: its own id"
    assert source.get(4)[2] == "task-4", "a record without id is named by the episode's index, as in episodes_of"
    assert TaskSource(None, 0).get(9)[2] == "task-9"


class Raises:
    async def run_one(self, episode: Episode) -> Trajectory:
        raise RuntimeError("runner broke")


async def test_a_runner_that_raised_gives_a_record_named_by_the_rule(tmp_path: Path) -> None:
    c = Coordinator(Raises(), TaskSource(None, 0), Ledger(tmp_path / "t.jsonl"), concurrency=1, buffer_size=2,
                    max_staleness=1)  # fmt: skip
    traj = await c._one(3, 0, None, c.tasks.get(3)[2])
    assert traj.status == "infra_error" and traj.task_id == "task-3"


async def test_the_ray_runner_names_its_infra_errors_by_the_rule() -> None:
    runner = RayRolloutRunner([], [], "sao/TokenGame-v0")  # no live worker: every episode is an infra error
    got = await asyncio.gather(runner.run_one(Episode(5)), runner.run_one(Episode(6, TASKS[2])))
    assert [t.task_id for t in got] == ["task-5", "repo__pkg-1"]
