"""`sao bench confirm` in a tiny form with every part real: the solver in Docker, SFT, SAO and GRPO on SmolLM2 with
DeepSpeed, held-out evals; 1 RL step per arm, 2 held-out tasks. The smoke size starts from the session's tiny
quickstart run (``--from-run``: its SFT checkpoint and eval are the shared start, its RL stage the SAO arm), so
only the GRPO arm trains here; the ``full`` size runs the shared stages and both arms itself. The full comparison
is in docs/benchmarks.md."""

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
from tests.integration.conftest import StagedRun

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.deepspeed]
ROOT = Path(__file__).resolve().parents[3]
TINY = [
    "collect.n=4", "sft.steps=1", "sft.batch_size=2", "eval.n=2", "eval.concurrency=2", "run.total_steps=1",
    "run.progress=false", "trainer.batch_size=2", "trainer.group_size=2", "rollout.concurrency=2",
    "rollout.buffer_size=2", "deepspeed.micro_batch_size=2", "pretrain_value.rollouts=4", "pretrain_value.epochs=1",
    "pretrain_value.concurrency=2",
]  # fmt: skip
# The arm's sizes, for a start from the tiny quickstart run (its eval's n, seed, temperature and samples are these
# too).
ARM = [
    "eval.n=2", "eval.samples=2", "eval.concurrency=2", "run.total_steps=1", "run.progress=false",
    "trainer.batch_size=2", "trainer.group_size=2", "rollout.concurrency=2", "rollout.buffer_size=2",
    "deepspeed.micro_batch_size=2",
]  # fmt: skip


def _confirm(args: list[str]) -> tuple[str, str]:
    """`sao bench confirm ARGS` in a session of its own: on a timeout the whole group goes, the bench's spawned
    stage processes included. Returns (stdout, stderr) of a run that exited 0."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sao.cli.main", "bench", "confirm", *args],
        cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, stderr[-4000:]
    return stdout, stderr


def test_confirm_bench_from_a_finished_run_trains_the_other_arm_and_reports(
    tiny_quickstart: StagedRun, tmp_path: Path
) -> None:
    assert tiny_quickstart.returncode == 0, "the tiny quickstart run failed:\n" + tiny_quickstart.stderr[-3000:]
    run, out = tiny_quickstart.run, tmp_path / "confirm"
    t0 = time.time()
    sets = [a for s in ARM for a in ("--set", s)]
    stdout, stderr = _confirm(["--out", str(out), "--arms", "sao,grpo", "--from-run", str(run), *sets])
    data = json.loads((out / "confirm.json").read_text())
    assert [a["arm"] for a in data["arms"]] == ["sao", "grpo"] and data["trajectories_per_arm"] == 2
    assert f"sao: the RL stage of {run}" in stdout + stderr and not (out / "arms" / "sao").exists()
    sft_model = str(run / "01_sft" / "final" / "actor")
    held_out = set(json.loads((run / "summary.json").read_text())["evals"][0]["solved_by_task"])
    cfg = yaml.safe_load((out / "arms" / "grpo" / "config.yaml").read_text())
    assert cfg["model"]["path"] == sft_model and cfg["trainer"]["algorithm"] == "grpo"
    summary = json.loads((out / "arms" / "grpo" / "summary.json").read_text())
    assert set(summary["evals"][-1]["solved_by_task"]) == held_out  # the same held-out tasks as the SFT eval
    steps = [json.loads(x) for x in (out / "arms" / "grpo" / "00_train" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1] and steps[0]["trained_episodes"] == 2 and "value_loss" not in steps[0]
    assert "| sao " in stdout and "| grpo " in stdout and "sao - grpo:" in stdout
    rows = {a["arm"]: a for a in data["arms"]}
    # the run's value pretraining (4 rollouts) and one warm-up batch of 2 trained only its critic
    assert rows["sao"]["critic_only_rollouts"] == 4 + 2 and rows["grpo"]["critic_only_rollouts"] == 0
    assert (out / "confirm.png").stat().st_size > 0
    print(f"confirm bench from a finished run: {time.time() - t0:.0f}s")


@pytest.mark.full
def test_confirm_bench_runs_both_arms_from_one_sft_checkpoint_and_reports(
    tmp_path: Path, smollm2_dir: Path, base_image: str
) -> None:
    out = tmp_path / "confirm"
    sets = [a for s in TINY for a in ("--set", s)]
    t0 = time.time()
    stdout, _ = _confirm(["--out", str(out), "--arms", "sao,grpo", *sets])
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
        assert [s["step"] for s in steps] == [1] and steps[0]["trained_episodes"] == (6 if arm == "sao" else 2)
        assert ("value_loss" in steps[0]) == (arm == "sao")  # SAO trains a critic, GRPO does not
    assert "| sao " in stdout and "| grpo " in stdout and "sao - grpo:" in stdout
    rows = {a["arm"]: a for a in data["arms"]}
    assert rows["sao"]["critic_only_rollouts"] == 4 + 2 * 2 and rows["grpo"]["critic_only_rollouts"] == 0
    assert (out / "confirm.png").stat().st_size > 0
    print(f"tiny confirm bench wall time {time.time() - t0:.0f}s")
