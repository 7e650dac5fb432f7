"""Bad numbers and checkpoints: weights holding NaN/inf are never checkpointed; the last good one stays latest."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sao.trainer.config import load_config

pytestmark = [pytest.mark.deepspeed]

ROOT = Path(__file__).resolve().parents[3]


def test_nonfinite_weights_leave_the_last_good_checkpoint_latest(deepspeed_env: dict[str, str], tmp_path: Path) -> None:
    from sao.trainer import distributed
    from sao.trainer.rollout.ledger import Ledger
    from sao.trainer.rollout.pipeline import Coordinator, TaskSource
    from sao.trainer.runs.run import Trainer
    from sao.trainer.runs.run_folder import latest_checkpoint

    distributed.init_distributed()
    cfg = load_config(ROOT / "configs" / "toy.yaml", [f"run.dir={tmp_path}", "run.tensorboard=false"])
    trainer = Trainer(cfg, tmp_path, None)

    async def never(*_: object) -> None:
        raise AssertionError("no episode runs in this test")

    coord = Coordinator(
        never,
        TaskSource(None, 0),
        Ledger(tmp_path / "trajectories.jsonl"),
        concurrency=1,
        buffer_size=1,
        max_staleness=0,
    )
    trainer.step = 1
    trainer._save(coord)
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_000001"
    with torch.no_grad():
        next(trainer.learner.actor.module.parameters()).view(-1)[0] = float("nan")
    assert not trainer.learner.params_finite()
    trainer.step = 2
    trainer._save(coord)
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step_000001"
    assert not (tmp_path / "checkpoints" / "step_000002").exists()
