"""The ledger after a kill that tore its last line: the resume marker is a line of its own (so the lost branch's
events are void) and the ledger stays readable through later appends; the fragment is kept beside it."""

from __future__ import annotations

from pathlib import Path

from sao.agent.records import Segment, Trajectory
from sao.core.jsonl import iter_jsonl
from sao.trainer.rollout.ledger import Ledger, replay


def _traj() -> Trajectory:
    return Trajectory("t", "scripted", (Segment("prompt", (1, 2)), Segment("action", (3,), (-0.5,), 0, 1.0)), 1.0)


def test_a_resume_after_a_torn_line_voids_the_lost_branch_and_the_ledger_stays_readable(tmp_path: Path) -> None:
    path = tmp_path / "trajectories.jsonl"
    led = Ledger(path)
    for k in range(4):
        led.arrived(f"u{k}", k, k, _traj(), 0)
    led.event(["u0", "u1"], "trained", 1, 0)
    led.event(["u2", "u3"], "trained", 2, 1)  # step 2 is lost: the checkpoint is from step 1
    led.close()
    with open(path, "ab") as f:
        f.write(b'{"type": "trajectory", "uid": "u4", "seq": 4, "traj')  # the kill tore this write
    led = Ledger(path)  # the resume
    led.resume(1)
    acc, pending = replay(path)
    assert (acc.trained, acc.pending) == (2, 2) and sorted(pending) == ["u2", "u3"], "the resume marker was lost"
    led.event(["u2", "u3"], "trained", 2, 1)
    led.close()
    acc, _ = replay(path)
    assert (acc.generated, acc.trained, acc.pending) == (4, 4, 0) and acc.balanced() and acc.double_trained == []
    assert [r["type"] for _, r in iter_jsonl(path)][-3:] == ["resume", "event", "event"]
    (side,) = tmp_path.glob("trajectories.jsonl.torn-*")
    assert side.read_bytes().startswith(b'{"type": "trajectory", "uid": "u4"')
