"""Coordinator and ledger logic with scripted episodes: staleness drops, backpressure, infra errors, accounting."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from agent.records import Segment, Trajectory
from trainer.ledger import Ledger, replay
from trainer.pipeline import Coordinator, TaskSource


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
        assert all(i.traj.status == "ok" for i in items)
        c.trained(items, step)
        c.version += 1
    await c.stop()
    acc, _ = replay(tmp_path / "trajectories.jsonl")
    assert acc.infra_error > 0 and acc.trained == 12
    assert acc.balanced() and not acc.double_trained
    assert script.max_running <= 4, "more episodes in flight than rollout.concurrency"


async def test_stale_trajectories_are_dropped_and_counted(tmp_path: Path) -> None:
    script = Script([])
    c = _coord(tmp_path, script, buffer_size=8, max_staleness=1)
    c.start()
    while len(c.buffer) < 8:  # fill the buffer at version 0
        await asyncio.sleep(0.01)
    c.version = 5  # the trainer moved on: everything buffered is 5 versions old
    items = await c.next_batch(2, 1)
    await c.stop()
    assert c.counters.dropped_stale >= 8
    assert all(c.lag(i.traj) <= 1 for i in items)
    acc, _ = replay(tmp_path / "trajectories.jsonl")
    assert acc.dropped_stale == c.counters.dropped_stale and acc.balanced()


async def test_full_buffer_pauses_new_episodes(tmp_path: Path) -> None:
    script = Script([])
    c = _coord(tmp_path, script, buffer_size=6, concurrency=2)
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
