"""The toy run learns: TokenGame with a tiny random-init model reaches success >= 0.9 within a fixed budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.xfail(
    reason="not reached yet: with configs/toy.yaml the tiny model learns to avoid the never-right symbol but not to "
    "copy (success ~0.3 after 80 steps, entropy collapses first); see the trainer issue report",
    strict=False,
)
def test_toy_sao_run_reaches_high_success(tmp_path: Path, deepspeed_env: dict[str, str], smollm2_dir: Path) -> None:
    from trainer.run import train

    run = train(str(ROOT / "configs/toy.yaml"), [f"run.dir={tmp_path / 'toy'}", "run.progress=false"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    last = rows[-3:]
    success = sum(r["success_rate"] for r in last) / len(last)
    assert success >= 0.9, f"success over the last 3 steps {success:.2f}; curve {[r['success_rate'] for r in rows]}"
    assert (run / "plots/curves.png").exists()
    assert rows[0]["success_rate"] < 0.9, "the toy task must not be solved before training"
