"""`sao bench confirm` in a tiny form with every part real: the solver in Docker, SFT, SAO and GRPO on SmolLM2 with
DeepSpeed, held-out evals; 1 RL step per arm, 2 held-out tasks. The full comparison is in docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import cli_env

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.deepspeed]
ROOT = Path(__file__).resolve().parents[3]
TINY = [
    "collect.n=4", "sft.steps=1", "sft.batch_size=2", "eval.n=2", "eval.concurrency=2", "run.total_steps=1",
    "run.progress=false", "trainer.batch_size=2", "trainer.group_size=2", "rollout.concurrency=2",
    "rollout.buffer_size=2", "deepspeed.micro_batch_size=2", "pretrain_value.rollouts=4", "pretrain_value.epochs=1",
    "pretrain_value.concurrency=2",
]  # fmt: skip


def test_confirm_bench_runs_both_arms_from_one_sft_checkpoint_and_reports(
    tmp_path: Path, smollm2_dir: Path, base_image: str
) -> None:
    out = tmp_path / "confirm"
    env = cli_env()
    sets = [a for s in TINY for a in ("--set", s)]
    t0 = time.time()
    # A session of its own: on a timeout the whole group goes, the bench's spawned stage processes included.
    proc = subprocess.Popen(
        [sys.executable, "-m", "sao.cli.main", "bench", "confirm", "--out", str(out), "--arms", "sao,grpo", *sets],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, stderr[-4000:]
    data = json.loads((out / "confirm.json").read_text())
    assert [a["arm"] for a in data["arms"]] == ["sao", "grpo"] and data["trajectories_per_arm"] == 2
    sft_model = str(out / "shared" / "01_sft" / "final" / "actor")
    held_out = set(json.loads((out / "shared" / "summary.json").read_text())["evals"][0]["solved_by_task"])
    for arm in ("sao", "grpo"):
        cfg = yaml.safe_load((out / "arms" / arm / "config.yaml").read_text())
        assert cfg["model"]["path"] == sft_model and cfg["trainer"]["algorithm"] == arm
        summary = json.loads((out / "arms" / arm / "summary.json").read_text())
        assert set(summary["evals"][-1]["solved_by_task"]) == held_out  # the same held-out tasks as the SFT eval
        train_dir = out / "arms" / arm / ("01_train" if arm == "sao" else "00_train")  # SAO pretrains its critic
        steps = [json.loads(x) for x in (train_dir / "metrics.jsonl").read_text().splitlines()]
        # the trained count includes SAO's two warm-up batches of 2 (critic only), then one policy step of 2
        assert [s["step"] for s in steps] == [1] and steps[0]["trained_trajectories"] == (6 if arm == "sao" else 2)
        assert ("value_loss" in steps[0]) == (arm == "sao")  # SAO trains a critic, GRPO does not
    assert "| sao " in stdout and "| grpo " in stdout and "sao - grpo:" in stdout
    rows = {a["arm"]: a for a in data["arms"]}
    assert rows["sao"]["critic_only_rollouts"] == 4 + 2 * 2 and rows["grpo"]["critic_only_rollouts"] == 0
    assert (out / "confirm.png").stat().st_size > 0
    print(f"tiny confirm bench wall time {time.time() - t0:.0f}s")
