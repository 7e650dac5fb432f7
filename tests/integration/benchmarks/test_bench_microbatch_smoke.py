"""Smoke run of `sao bench microbatch` through the CLI (tiny model, a run-style trajectories JSONL of uneven
episodes): both cuts train the same tokens on the real learner step; the token budget pads less; JSON, table, PNG."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli_env

pytestmark = [pytest.mark.deepspeed]
ROOT = Path(__file__).resolve().parents[3]


def _run_records(path: Path, smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    from sao.benchmarks.bench_microbatch import MicrobatchBenchConfig, synthetic_trajectories

    cfg = MicrobatchBenchConfig(out=path.parent, n=6, min_tokens=30, max_tokens=300)
    trajs = synthetic_trajectories(cfg, AutoTokenizer.from_pretrained(str(smollm2_dir)))
    random.Random(0).shuffle(trajs)
    lines = [json.dumps({"type": "trajectory", "uid": i, "trajectory": t.to_dict()}) for i, t in enumerate(trajs)]
    path.write_text("\n".join([*lines, json.dumps({"type": "event", "uid": 0, "event": "trained"})]) + "\n")


def test_bench_microbatch_smoke(tmp_path: Path, smollm2_dir: Path) -> None:
    src = tmp_path / "trajectories.jsonl"
    _run_records(src, smollm2_dir)
    out = tmp_path / "bench"
    cmd = [
        sys.executable, "-m", "sao.cli.main", "bench", "microbatch", "--tiny", "--trajectories", str(src),
        "--n", "6", "--micro-batch-size", "2", "--micro-batch-tokens", "256", "--layers", "1", "--threads", "1",
        "--out", str(out),
    ]  # fmt: skip
    res = subprocess.run(cmd, env=cli_env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    doc = json.loads((out / "microbatch.json").read_text())
    rows, tokens = doc["variants"]["rows"], doc["variants"]["tokens"]
    assert doc["batch"]["trajectories"] == 6 and doc["batch"]["source"] == str(src) and doc["config"]["layers"] == 1
    assert rows["micro_batch_tokens"] == 0 and tokens["micro_batch_tokens"] == 256
    assert rows["real_tokens"] == tokens["real_tokens"] == doc["batch"]["tokens_total"]
    assert rows["trained_action_tokens"] == tokens["trained_action_tokens"] > 0
    assert tokens["padding_frac"] < rows["padding_frac"]
    assert doc["loss_abs_diff"]["pg_loss"] < 1e-4 and doc["loss_abs_diff"]["value_loss"] < 1e-4  # the same step
    assert tokens["largest_micro_batch_positions"] <= max(256, doc["batch"]["tokens_max"])
    assert rows["peak_extra_bytes"] > 0 and tokens["tokens_per_s"] > 0
    assert "| row cut" in res.stdout and "| token budget 256" in res.stdout
    assert (out / "microbatch.png").stat().st_size > 0
