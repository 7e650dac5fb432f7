"""The coordinator with multi-row episodes (a harness episode whose gateway session broke its prefix has several rows):
the episode is the unit of admission, batching, staleness and grouping (issue 44 item 1)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sao.agent.records import Segment, Trajectory
from sao.trainer.rollout.ledger import Ledger, replay
from sao.trainer.rollout.pipeline import Coordinator, Item, TaskSource


class MultiRow:
    """Episode ``i`` has ``rows(i)`` rows, each sampled ``delay`` seconds after the previous one with the
    coordinator's version at that moment (as a gateway session's rows are); every row carries the episode's outcome.
    The reward alternates by task so that GRPO groups see different outcomes."""

    def __init__(self, box: list[Coordinator], rows: Any, delay: float = 0.004) -> None:
        self.box, self.rows, self.delay = box, rows, delay
        self.calls = 0

    async def run_one(self, episode: Any) -> list[Trajectory]:
        self.calls += 1
        call, n = self.calls, self.rows(episode.index)
        reward = float((episode.index + call) % 2)
        out = []
        for row in range(n):
            version = self.box[0].version
            await asyncio.sleep(self.delay)
            segs = (Segment("prompt", (1, 2)), Segment("action", (3, 4), (-0.5, -0.5), version))
            info = {"row": row, "rows": n, "episode": episode.index, "call": call}
            out.append(Trajectory(f"t{episode.index}", "scripted", segs, reward, info=info))
        return out


def _cycle(i: int) -> int:
    return (1, 1, 1, 2)[i % 4]


async def _run(c: Coordinator, steps: int, batch: int, group: int) -> list[list[Item]]:
    """The trainer loop of ``sao.trainer.runs.run`` (sync: ``allow_next_batch`` before the first batch and after
    each step); checks every batch as it is handed out."""
    batches: list[list[Item]] = []
    if c.synchronous:
        c.allow_next_batch(batch)
    c.start()
    for step in range(1, steps + 1):
        items = await asyncio.wait_for(c.next_batch(batch, step), 10)
        assert len(items) == batch, f"step {step}: {len(items)} episodes, wanted {batch}"
        for item in items:
            lag = c.lag(item)
            assert lag <= c.max_staleness, f"step {step}: an episode trained at lag {lag} > {c.max_staleness}"
            n = {int(r.info["rows"]) for r in item.rows}
            assert n == {len(item.rows)}, f"step {step}: an episode's rows were split: {len(item.rows)} of {n}"
            assert len({r.info["call"] for r in item.rows}) == 1, "rows of different episodes in one item"
        if group > 1:
            members: dict[int, int] = {}
            for item in items:
                gid = item.rows[0].group_id
                assert gid is not None and all(r.group_id == gid for r in item.rows)
                members[gid] = members.get(gid, 0) + 1
            assert set(members.values()) == {group}, f"step {step}: a GRPO group was split: {members}"
        c.trained(items, step)
        batches.append(items)
        await asyncio.sleep(0.005)
        c.version += 1
        if c.synchronous:
            c.allow_next_batch(batch)
    return batches


MODES = [
    pytest.param(policy, sync, group, id=f"{policy}-{'sync' if sync else 'async'}-{'grpo' if group > 1 else 'sao'}")
    for policy in ("wait", "drop")
    for sync in (False, True)
    for group in (1, 2)
]


@pytest.mark.parametrize(("policy", "sync", "group"), MODES)
@pytest.mark.parametrize("rows", [_cycle, lambda i: 3], ids=["rows-1-1-1-2", "rows-3"])
async def test_multi_row_episodes_train_whole_within_the_bound(
    tmp_path: Path, policy: str, sync: bool, group: int, rows: Any
) -> None:
    # issue 44: rows per episode cycling 1,1,1,2 hung at step 4 (admission counted episodes, batches took rows);
    # with 3 rows per episode a third of the rows trained at lag 2 under max_staleness 1
    box: list[Coordinator] = []
    batch = 4
    c = Coordinator(
        MultiRow(box, rows), TaskSource(None, 0), Ledger(tmp_path / "trajectories.jsonl"),
        concurrency=4, buffer_size=8, max_staleness=0 if sync else 1, group_size=group, synchronous=sync,
        staleness_policy=policy, batch_size=batch,
    )  # fmt: skip
    box.append(c)
    try:
        batches = await _run(c, 8, batch, group)
    finally:
        await c.stop()
    trained_rows = sum(len(i.rows) for b in batches for i in b)
    if policy == "wait":
        assert c.counters.dropped_stale == 0, "the wait policy dropped finished work"
    assert c.counters.episodes_trained == 8 * batch and c.counters.trained == trained_rows
    acc, _ = replay(tmp_path / "trajectories.jsonl")
    assert acc.balanced() and not acc.double_trained and acc.trained == trained_rows
    assert acc.episodes_trained == 8 * batch


async def test_restore_puts_an_episodes_rows_back_as_one_item(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    led = Ledger(path)
    segs = (Segment("prompt", (1,)), Segment("action", (3,), (-0.5,), 0))
    rows = [Trajectory("t", "s", segs, 1.0, info={"row": r, "rows": 2}) for r in range(2)]
    for k, row in enumerate(rows):
        led.arrived(f"u{k}", k, 0, row, 0, episode="e0")
    led.arrived("u2", 2, 1, Trajectory("t", "s", segs, 0.0), 0, episode="e1")
    _, pending = replay(path)
    c = Coordinator(object(), TaskSource(None, 0), led, concurrency=1, buffer_size=8, max_staleness=2)  # type: ignore[arg-type]
    c.restore(list(pending.values()), step=0)
    assert [i.uids for i in c.buffer] == [["u0", "u1"], ["u2"]]
    led.close()


class Lagging(MultiRow):
    """Task ``stale``'s episodes come back sampled one version behind (an engine that missed a sync)."""

    def __init__(self, box: list[Coordinator], stale: int) -> None:
        super().__init__(box, _cycle)
        self.stale = stale

    async def run_one(self, episode: Any) -> list[Trajectory]:
        rows = await super().run_one(episode)
        if episode.index != self.stale:
            return rows
        segs = (Segment("prompt", (1, 2)), Segment("action", (3, 4), (-0.5, -0.5), self.box[0].version - 1))
        return [Trajectory(r.task_id, r.env_id, segs, r.reward, info=r.info) for r in rows]


@pytest.mark.parametrize("group", [1, 2])
async def test_a_synchronous_batch_whose_episode_was_dropped_starts_another(tmp_path: Path, group: int) -> None:
    box: list[Coordinator] = []
    c = Coordinator(
        Lagging(box, stale=5), TaskSource(None, 0), Ledger(tmp_path / "trajectories.jsonl"), concurrency=4,
        buffer_size=8, max_staleness=0, group_size=group, synchronous=True, staleness_policy="drop", batch_size=4,
    )  # fmt: skip
    box.append(c)
    try:
        await _run(c, 4, 4, group)
    finally:
        await c.stop()
    assert c.counters.episodes_dropped_stale == group and c.counters.episodes_trained == 16
