"""One rule names a task (``sao.agent.episodes.task_id_of``): the episode, the trainer's task source, the coordinator's
guard record and the Ray runner's infra errors all give the same id (``task-<index>`` when the record has none)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.episodes import Episode, EpisodeRunner, RunnerConfig, TokenPlayer, env_factory, episodes_of, task_id_of
from sao.agent.loop import AgentConfig
from sao.agent.records import Trajectory
from sao.trainer.cluster.ray_backend import RayRolloutRunner
from sao.trainer.rollout.ledger import Ledger
from sao.trainer.rollout.pipeline import Coordinator, TaskSource
from tests.unit.agent.agent_fakes import CharChatMLTokenizer

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
    assert TaskSource(None, 0).get(9)[2] is None, "a task the env draws itself is named by the env"


def token_game_runner() -> EpisodeRunner:
    """The real TokenGame env drawing its own tasks, played by a scripted engine that always answers "A"."""
    tok = CharChatMLTokenizer()
    player = TokenPlayer(ScriptedEngine([[*tok.encode("A"), tok.eos_token_id]]), tok, AgentConfig())
    make = env_factory("sao/TokenGame-v0", {"turns": 2, "symbols": "AB"})
    return EpisodeRunner(make, player, RunnerConfig(2, progress=False))


async def test_env_sampled_tasks_keep_the_envs_own_id_in_every_record(tmp_path: Path) -> None:
    ledger = tmp_path / "trajectories.jsonl"
    c = Coordinator(token_game_runner(), TaskSource(None, 0), Ledger(ledger), concurrency=2, buffer_size=4,
                    max_staleness=1)  # fmt: skip
    c.start()
    items = await c.next_batch(4, 0)
    await c.stop()
    # TokenGame names a task by its symbols (e.g. "A-B"), never by the episode's index
    ids = [r.task_id for i in items for r in i.rows]
    assert all(re.fullmatch(r"[AB]-[AB]", t) for t in ids), ids
    on_disk = [json.loads(x) for x in ledger.read_text().splitlines()]
    recorded = [r["trajectory"]["task_id"] for r in on_disk if r.get("type") == "trajectory"]
    assert len(recorded) >= 4 and all(re.fullmatch(r"[AB]-[AB]", t) for t in recorded), recorded


async def test_the_runner_keeps_the_envs_id_and_a_records_own_id(tmp_path: Path) -> None:
    got: list[Trajectory] = []
    episodes = [Episode(3, None, seed=3), Episode(4, {"id": "mine", "sequence": ["A", "B"]}, seed=4)]
    await token_game_runner().run(episodes, on_trajectory=got.append)
    by_episode = {t.info["episode"]: t.task_id for t in got}
    assert re.fullmatch(r"[AB]-[AB]", by_episode[3]), by_episode
    assert by_episode[4] == "mine"


class Raises:
    async def run_one(self, episode: Episode) -> Trajectory:
        raise RuntimeError("runner broke")


async def test_a_runner_that_raised_gives_a_record_named_by_the_rule(tmp_path: Path) -> None:
    c = Coordinator(Raises(), TaskSource(None, 0), Ledger(tmp_path / "t.jsonl"), concurrency=1, buffer_size=2,
                    max_staleness=1)  # fmt: skip
    [traj] = await c._one(3, 0, None, c.tasks.get(3)[2])
    assert traj.status == "infra_error" and traj.task_id == "task-3"


async def test_the_ray_runner_names_its_infra_errors_by_the_rule() -> None:
    runner = RayRolloutRunner([], [], "sao/TokenGame-v0")  # no live worker: every episode is an infra error
    got = await asyncio.gather(runner.run_one(Episode(5)), runner.run_one(Episode(6, TASKS[2])))
    assert [t.task_id for t in got] == ["task-5", "repo__pkg-1"]
