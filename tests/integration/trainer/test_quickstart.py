"""`sao train configs/quickstart.yaml` end to end: SmolLM2, PythonTool env in Docker, HF engine, DeepSpeed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.deepspeed]
ROOT = Path(__file__).resolve().parents[3]


def test_quickstart_writes_metrics_plot_and_final_checkpoint(
    tmp_path: Path, smollm2_dir: Path, base_image: str
) -> None:
    import os

    from saocore.paths import torch_extensions_dir

    run = tmp_path / "qs"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir()))
    t0 = time.time()
    res = subprocess.run(
        [sys.executable, "-m", "sao_cli.main", "train", str(ROOT / "configs/quickstart.yaml"), f"run.dir={run}",
         "run.progress=false"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("reward_mean", "value_loss", "explained_variance", "actor_grad_norm", "weight_sync_s"):
        assert key in rows[-1]
    assert (run / "plots/curves.png").stat().st_size > 0
    assert (run / "final/actor/model.safetensors").exists()
    assert (run / "final/critic/value_head.safetensors").exists()
    print(f"quickstart wall time {time.time() - t0:.0f}s")
