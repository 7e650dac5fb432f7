"""Coordinator and ledger logic with scripted episodes: staleness drops, backpressure, infra errors, accounting."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from sao.agent.records import Segment, Trajectory
from sao.trainer.rollout.ledger import Ledger, replay
from sao.trainer.rollout.pipeline import Coordinator, TaskSource


def _traj(version: int, status: str = "ok") -> Trajectory:
    segs = (Segment("prompt", (1, 2)), Segment("action", (3,), (-0.5,), version, 1.0))
    return Trajectory("t", "scripted", segs, 1.0, status)  # type: ignore[arg-type]


class Script:
    """Episodes that finish after ``delay`` seconds with the coordinator's current version; every 5th fails."""

    def __init__(self, coord_box: list[Coordinator], delay: float = 0.001, fail_every: int = 0) -> None:
        self.box, self.delay, self.fail_every = coord_box, delay, fail_every
        self.running = 0
        self.max_running = 0

    async def run_one(self, episode: Any) -> Trajectory:
        index = episode.index
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        version = self.box[0].version
        try:
            await asyncio.sleep(self.delay)
            if self.fail_every and index % self.fail_every == self.fail_every - 1:
                raise RuntimeError("sandbox died")
            return _traj(version)
        finally:
            self.running -= 1


def _coord(tmp_path: Path, script: Script, **kw: Any) -> Coordinator:
    args: dict[str, Any] = {"concurrency": 4, "buffer_size": 8, "max_staleness": 1}
    args.update(kw)
    c = Coordinator(script, TaskSource(None, 0), Ledger(tmp_path / "trajectories.jsonl"), **args)
    script.box.append(c)
    return c


async def test_infra_errors_are_recorded_and_never_trained(tmp_path: Path) -> None:
    script = Script([], fail_every=5)
    c = _coord(tmp_path, script)
    c.start()
    for step in range(1, 4):
        items = await c.next_batch(4, step)
        assert all(r.status == "ok" for i in items for r in i.rows)
        c.trained(items, step)
        c.version += 1
    await c.stop()
    acc, _ = replay(tmp_path / "trajectories.jsonl")
    assert acc.infra_error > 0 and acc.trained == 12
    assert acc.balanced() and not acc.double_trained
    assert script.max_running <= 4, "more episodes in flight than rollout.concurrency"


async def test_stale_trajectories_are_dropped_and_counted(tmp_path: Path) -> None:
    script = Script([])
    c = _coord(tmp_path, script, buffer_size=8, max_staleness=1, staleness_policy="drop")
    c.start()
    while len(c.buffer) < 8:  # fill the buffer at version 0
        await asyncio.sleep(0.01)
    c.version = 5  # the trainer moved on: everything buffered is 5 versions old
    items = await c.next_batch(2, 1)
    await c.stop()
    assert c.counters.dropped_stale >= 8
    assert all(c.lag(i) <= 1 for i in items)
    acc, _ = replay(tmp_path / "trajectories.jsonl")
    assert acc.dropped_stale == c.counters.dropped_stale and acc.balanced()


async def test_full_buffer_pauses_new_episodes(tmp_path: Path) -> None:
    script = Script([])
    # a loose bound, so only the buffer limits starts here (admission control is tested below)
    c = _coord(tmp_path, script, buffer_size=6, concurrency=2, max_staleness=8)
    c.start()
    await asyncio.sleep(0.3)
    assert len(c.buffer) <= 6
    started = c.counters.episodes_started
    await asyncio.sleep(0.2)
    assert c.counters.episodes_started == started, "episodes kept starting while the buffer was full"
    await c.next_batch(3, 1)
    await asyncio.sleep(0.2)
    assert c.counters.episodes_started > started, "taking a batch did not resume the producer"
    await c.stop()


def test_replay_voids_the_lost_branch_after_a_resume(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    led = Ledger(path)
    for k in range(4):
        led.arrived(f"u{k}", k, k, _traj(0), 0)
    led.event(["u0", "u1"], "trained", 1, 0)
    led.event(["u2", "u3"], "trained", 2, 1)  # step 2 was lost: the checkpoint is from step 1
    led.resume(1)
    acc, pending = replay(path)
    assert (acc.trained, acc.pending) == (2, 2) and sorted(pending) == ["u2", "u3"]
    led.event(["u2", "u3"], "trained", 2, 1)
    led.close()
    with open(path, "a") as f:
        f.write('{"type": "traj')  # a torn last line from a kill mid-write
    acc, _ = replay(path)
    assert acc.trained == 4 and acc.pending == 0 and acc.balanced() and acc.double_trained == []
    assert json.loads(path.read_text().splitlines()[0])["type"] == "trajectory"


class LongFirst:
    """Episode 0 runs ``long`` seconds, the others ``short``; each reports the coordinator's version at start."""

    def __init__(self, coord_box: list[Coordinator], long: float = 0.6, short: float = 0.005) -> None:
        self.box, self.long, self.short = coord_box, long, short

    async def run_one(self, episode: Any) -> Trajectory:
        version = self.box[0].version
        await asyncio.sleep(self.long if episode.index == 0 else self.short)
        n = 50 if episode.index == 0 else 1
        segs = (Segment("prompt", (1, 2)), Segment("action", (3,) * n, (-0.5,) * n, version, 1.0))
        return Trajectory(f"t{episode.index}", "scripted", segs, 1.0)


async def _train(c: Coordinator, steps: int, batch: int) -> list[tuple[str, int]]:
    """A trainer loop: take a batch, 'train' it (the version moves on); returns (task, lag) of what it trained."""
    trained: list[tuple[str, int]] = []
    for step in range(1, steps + 1):
        items = await asyncio.wait_for(c.next_batch(batch, step), 10)
        trained += [(i.rows[0].task_id, c.lag(i)) for i in items]
        c.trained(items, step)
        await asyncio.sleep(0.01)
        c.version += 1
    return trained


async def test_wait_trains_the_long_episode_within_the_bound(tmp_path: Path) -> None:
    # issue 21 item 3: under `drop` the long episode comes back too old and is thrown away (only short episodes
    # train); under `wait` admission control holds the bound without dropping it
    script = LongFirst([])
    c = _coord(tmp_path, script, concurrency=4, buffer_size=8, max_staleness=1, staleness_policy="wait", batch_size=2)
    c.start()
    trained = await _train(c, 12, 2)
    await c.stop()
    assert c.counters.dropped_stale == 0
    assert "t0" in [task for task, _ in trained], "the long episode was never trained"
    assert max(lag for _, lag in trained) <= 1, f"the staleness bound broke: {trained}"
    acc, _ = replay(tmp_path / "trajectories.jsonl")
    assert acc.dropped_stale == 0 and acc.balanced()


async def test_drop_policy_drops_the_long_episode(tmp_path: Path) -> None:
    script = LongFirst([])
    c = _coord(tmp_path, script, concurrency=4, buffer_size=8, max_staleness=1, staleness_policy="drop")
    c.start()
    trained = await _train(c, 12, 2)
    await c.stop()
    assert c.counters.dropped_stale >= 1 and "t0" not in [task for task, _ in trained]


class EnvTasks:
    """Plays nothing: resets the real TokenGame env with the episode's seed/options and reports its prompt (the
    task the env drew) as the task id, as a real episode would see it."""

    def __init__(self) -> None:
        import gymnasium

        import sao.envs  # noqa: F401 - registers the sao/ ids

        self.env = gymnasium.make("sao/TokenGame-v0", turns=[1, 4], symbols="AB", rule="copy")

    async def run_one(self, episode: Any) -> Trajectory:
        obs, _ = await self.env.unwrapped.areset(seed=episode.seed, options=episode.options)
        segs = (Segment("prompt", (1,)), Segment("action", (3,), (-0.5,), 0, 0.0))
        return Trajectory(str(obs), "scripted", segs, 0.0)


async def test_group_members_play_the_same_task_from_the_envs_own_sampler(tmp_path: Path) -> None:
    # issue 23 defect 1: member k used seed + k, so with the env's own sampler each member drew another task
    runner = EnvTasks()
    c = Coordinator(
        runner, TaskSource(None, 0), Ledger(tmp_path / "trajectories.jsonl"),
        concurrency=8, buffer_size=16, max_staleness=4, group_size=4,
    )  # fmt: skip
    c.start()
    items = await asyncio.wait_for(c.next_batch(16, 1), 10)
    await c.stop()
    tasks: dict[int, set[str]] = {}
    for i in items:
        assert i.group is not None and i.rows[0].group_id == i.group
        tasks.setdefault(i.group, set()).add(i.rows[0].task_id)
    assert len(tasks) == 4 and all(len(t) == 1 for t in tasks.values()), f"a group played several tasks: {tasks}"
    assert len({next(iter(t)) for t in tasks.values()}) > 1, "every group played the same task"
    recs = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    by_group: dict[int, set[str]] = {}
    for r in recs:
        if r.get("type") == "trajectory":
            by_group.setdefault(r["trajectory"]["group_id"], set()).add(r["trajectory"]["task_id"])
    assert all(len(t) == 1 for t in by_group.values()), f"the ledger's groups and tasks disagree: {by_group}"
