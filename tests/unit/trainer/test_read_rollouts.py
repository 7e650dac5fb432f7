"""Value-pretraining input: JSONL records, a run's ledger, or parquet; infra errors and action-less episodes out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sao.agent.records import Segment, Trajectory, write_jsonl
from sao.agent.records_arrow import write_parquet
from sao.trainer.config import ConfigError
from sao.trainer.learn.value_pretrain import read_rollouts


def _trajs() -> list[Trajectory]:
    act = Segment("action", (2, 3), (-0.1, -0.2), 0, 1.0)
    return [
        Trajectory("ok", "e", (Segment("prompt", (1,)), act), 1.0),
        Trajectory("infra", "e", (Segment("prompt", (1,)),), 0.0, "infra_error"),
        Trajectory("no-actions", "e", (Segment("prompt", (1,)),), 0.0),
    ]


def test_every_format_gives_the_trainable_trajectories(tmp_path: Path) -> None:
    trajs = _trajs()
    write_jsonl(tmp_path / "t.jsonl", trajs)
    write_parquet(tmp_path / "t.parquet", trajs)
    ledger = tmp_path / "trajectories.jsonl"
    ledger.write_text(
        "".join(
            json.dumps({"type": "trajectory", "uid": str(i), "trajectory": t.to_dict()}) + "\n"
            for i, t in enumerate(trajs)
        )
        + json.dumps({"type": "event", "uid": "0", "event": "trained", "step": 1, "version": 1})
        + "\n"
    )
    for p in ("t.jsonl", "t.parquet", "trajectories.jsonl"):
        assert read_rollouts(tmp_path / p) == trajs[:1], p


def test_bad_inputs_name_the_file_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="parquet file written by"):
        read_rollouts(tmp_path / "missing.jsonl")
    write_jsonl(tmp_path / "none.jsonl", _trajs()[1:])
    with pytest.raises(ConfigError, match="no trainable trajectories"):
        read_rollouts(tmp_path / "none.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"task_id": 1}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: not a trajectory record"):
        read_rollouts(tmp_path / "bad.jsonl")
