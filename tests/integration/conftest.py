"""Session fixtures shared across rooms: one tiny staged quickstart run, checked by the quickstart test and taken
by the confirm bench's smoke as its shared start and its SAO arm (``--from-run``), so CI pays for it once."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import cli_env

ROOT = Path(__file__).resolve().parents[2]
# Every stage for real, sized down: SFT one step of 2 (its full size takes ~3 min here and checks nothing more).
TINY_QUICKSTART = [
    "collect.n=4", "sft.steps=1", "sft.batch_size=2", "eval.n=2", "eval.concurrency=2", "run.total_steps=1",
    "run.save_every=1", "trainer.batch_size=2", "rollout.concurrency=2", "rollout.buffer_size=2",
    "deepspeed.micro_batch_size=2", "run.progress=false", "pretrain_value.rollouts=4", "pretrain_value.epochs=1",
    "pretrain_value.concurrency=2", "trainer.critic_warmup_steps=1", "eval.critic_probe=true", "eval.samples=2",
]  # fmt: skip


@dataclass(frozen=True)
class StagedRun:
    """A finished `sao train` subprocess: its run folder, exit code, output and wall time."""

    run: Path
    returncode: int
    stdout: str
    stderr: str
    wall_s: float


@pytest.fixture(scope="session")
def tiny_quickstart(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path, base_image: str) -> StagedRun:
    """`sao train configs/quickstart.yaml` with ``TINY_QUICKSTART`` (collect, SFT, eval, value pretraining, RL,
    eval), run once per session; the tests using it assert on its outcome."""
    run = tmp_path_factory.mktemp("quickstart") / "qs"
    t0 = time.time()
    res = subprocess.run(
        [sys.executable, "-m", "sao.cli.main", "train", str(ROOT / "configs/quickstart.yaml"), f"run.dir={run}",
         *TINY_QUICKSTART],
        cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    return StagedRun(run, res.returncode, res.stdout, res.stderr, time.time() - t0)
