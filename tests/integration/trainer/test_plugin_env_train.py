"""`sao train` on an env from a pip-installed package (a `sao.envs` entry point) for one step, and the console it
shows: our progress line only (at most 80 columns); third-party bars and warnings land in RUN_DIR/logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._plugin_env import PLUGIN_ENV_ID, install_plugin

ROOT = Path(__file__).resolve().parents[3]
# What third-party output looks like on a console: tqdm bars, DeepSpeed's and transformers' log lines.
THIRD_PARTY = re.compile(r"it/s\]|Writing model shards|Loading weights|\[WARNING\]|\[INFO\]|ds_accelerator|accelerator")

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]


def test_plugin_env_trains_a_step_with_a_quiet_console(tmp_path: Path) -> None:
    from sao.core.paths import torch_extensions_dir

    site = install_plugin(tmp_path / "plugin")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(torch_extensions_dir()))
    env["PYTHONPATH"] = f"{site}{os.pathsep}{ROOT}"
    run_dir = tmp_path / "run"
    overrides = [
        f"run.dir={run_dir}", "run.total_steps=1", "run.save_every=1", "run.plot=false", "run.tensorboard=false",
        f"env.id={PLUGIN_ENV_ID}", "env.kwargs={turns: 1, symbols: AB}", "trainer.batch_size=4",
        "deepspeed.micro_batch_size=4", "rollout.concurrency=4", "rollout.buffer_size=4",
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "sao.cli.main", "train", str(ROOT / "configs/toy.yaml"), *overrides]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]
    assert len((run_dir / "trajectories.jsonl").read_text().splitlines()) >= 4  # one batch was played and trained

    console = res.stdout + res.stderr
    assert not THIRD_PARTY.search(console), console
    progress = [line for line in res.stderr.splitlines() if line.startswith("train ")]
    assert progress and progress[-1].startswith("train 1/1 [##########]"), res.stderr
    assert all(len(line) <= 80 for line in progress), progress
    # The third-party output happened, and went to the log: the test would see it on the console otherwise.
    log = (run_dir / "logs" / "third_party.log").read_text()
    assert "Writing model shards" in log and "accelerator" in log.lower()
