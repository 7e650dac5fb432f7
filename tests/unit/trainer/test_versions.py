"""Versions after a rollback: a resume never reuses a version, and a trajectory's lag is counted along the branches,
so a pending trajectory of the discarded branch is as stale as it really is and the staleness bound applies to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sao.agent.records import Segment, Trajectory
from sao.trainer.rollout.ledger import Ledger, replay
from sao.trainer.rollout.pipeline import Coordinator, TaskSource
from sao.trainer.rollout.versions import Lineage


def traj(version: int) -> Trajectory:
    segs = (Segment("prompt", (1, 2)), Segment("action", (3,), (-0.5,), version, 1.0))
    return Trajectory(f"v{version}", "scripted", segs, 1.0)


def test_the_distance_runs_through_the_fork() -> None:
    # versions 0..7 trained, checkpoint at 4, crash; the resume goes on as 8 (= 4's weights), then 9, 10
    line = Lineage({8: 4})
    assert [line.depth(v) for v in (0, 4, 7, 8, 10)] == [0, 4, 7, 4, 6]
    assert line.distance(3, 10) == 3  # on the current branch: 3 -> 4 = 8 -> 9 -> 10
    assert line.distance(4, 8) == 0  # the resumed weights are the checkpoint's
    assert line.distance(7, 8) == 3  # 7 is 3 updates past the fork on the discarded branch
    assert line.distance(6, 10) == 2 + 2
    # a second rollback, to 9, while 10..11 were trained: the run goes on as 12
    line = Lineage({8: 4, 12: 9})
    # 11 is 2 past the fork at 9; 7 is 3 past the first fork at 4, and 13 is 2 updates past 4 (via 9 = 5, 13 = 6)
    assert line.distance(11, 12) == 2 and line.distance(7, 13) == 3 + 2 and line.distance(3, 13) == 3
    with pytest.raises(ValueError, match="starts above"):
        Lineage({3: 5})


def test_a_resume_never_reuses_a_version_and_replay_reads_the_aliases(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    led = Ledger(path)
    for k, v in enumerate([0, 1, 2, 3, 4, 5]):
        led.arrived(f"u{k}", k, k, traj(v), v)
    for step in range(1, 6):
        led.event([f"u{step - 1}"], "trained", step, step - 1)  # step s trains at version s - 1, making version s
    acc, pending = replay(path, resume_from=2)  # the checkpoint of step 2 (version 2)
    assert acc.max_version == 5 and sorted(pending) == ["u2", "u3", "u4", "u5"]
    led.resume(2, 2, acc.max_version + 1)
    acc, pending = replay(path)
    assert acc.aliases == {6: 2} and acc.max_version == 6 and sorted(pending) == ["u2", "u3", "u4", "u5"]
    led.close()


async def test_restored_trajectories_of_the_lost_branch_keep_their_true_lag(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "trajectories.jsonl")
    for k, v in enumerate((1, 2, 3, 5)):
        led.arrived(f"u{v}", k, k, traj(v), v)
    _, pending = replay(tmp_path / "trajectories.jsonl")
    c = Coordinator(object(), TaskSource(None, 0), led, concurrency=1, buffer_size=8, max_staleness=2,  # type: ignore[arg-type]
                    lineage=Lineage({6: 2}))  # fmt: skip
    c.version = 6  # resumed from version 2's checkpoint after versions 3..5 were lost
    c.restore(list(pending.values()), step=2)
    # v1: 1 update behind the checkpoint; v2: none; v3: 1 past the fork; v5: 3 past it, beyond the bound: dropped
    assert [(i.uids, c.lag(i)) for i in c.buffer] == [(["u1"], 1), (["u2"], 0), (["u3"], 1)]
    assert c.counters.dropped_stale == 1
    c.version = 7  # one update later every lag grows by one, and the deadlines follow the same numbers
    assert [c.lag(i) for i in c.buffer] == [c.version - i.start for i in c.buffer] == [2, 1, 2]
    led.close()
    acc, _ = replay(tmp_path / "trajectories.jsonl")
    assert (acc.dropped_stale, acc.pending) == (1, 3) and acc.balanced()  # recorded, so the books balance


def test_without_a_resume_the_lag_is_the_plain_difference(tmp_path: Path) -> None:
    c = Coordinator(object(), TaskSource(None, 0), Ledger(tmp_path / "t.jsonl"), concurrency=1, buffer_size=8,  # type: ignore[arg-type]
                    max_staleness=2)  # fmt: skip
    c.version = 5
    assert c.lag(traj(3)) == 2 and c.lag(traj(5)) == 0
