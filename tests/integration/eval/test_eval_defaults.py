"""`sao eval swebench --model smollm2` as a new user first types it, with the command's defaults: the alias serves
SmolLM2 on vLLM (the engine staged runs use) with the context its config allows (8,192 positions) and 1/16 of it per
turn, so offline tasks finish in minutes (with the in-process engine and a 4,096-token turn the first turn took
longer than 18 minutes). Smoke size: one task, one step; the full size (three tasks, every default) is marked
``full``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cli_env

pytestmark = [pytest.mark.docker, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("n_tasks", "extra"),
    [
        pytest.param(1, ["--max-steps", "1"], id="smoke"),
        pytest.param(3, ["--workers", "3"], id="three_tasks", marks=pytest.mark.full),
    ],
)
def test_smollm2_alias_with_the_defaults_finishes_in_minutes(
    n_tasks: int, extra: list[str], offline_records: list[dict[str, Any]], smollm2_dir: Path, tmp_path: Path
) -> None:
    config = json.loads((smollm2_dir / "config.json").read_text())
    context = min(config["max_position_embeddings"], 32768)
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in offline_records[:n_tasks]))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "sao.cli.main", "eval", "swebench", "--model", "smollm2", "--dataset", str(dataset)]
    t0 = time.monotonic()
    res = subprocess.run([*cmd, "--out", str(out), *extra], cwd=ROOT, env=cli_env(), capture_output=True, text=True)
    wall = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-4000:]
    # the limits the run used come from the model's config, and the alias ran on the vLLM server we started
    assert f"context {context} tokens, at most {context // 16} sampled per turn" in res.stderr + res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["total"] == n_tasks and report["infra_errors"] == 0, report["instances"]
    assert report["resolved"] + report["unresolved"] == n_tasks
    trajs = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == n_tasks and all(t["info"]["turns"] >= 1 for t in trajs)
    for t in trajs:
        actions = [s for s in t["segments"] if s["kind"] == "action"]
        assert actions and max(len(s["token_ids"]) for s in actions) <= context // 16
    print(f"sao eval swebench --model smollm2, {n_tasks} task(s): {wall:.0f} s")
