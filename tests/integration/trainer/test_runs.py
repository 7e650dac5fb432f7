"""Whole `sao train` runs in subprocesses: kill -9 and resume accounting, 2-rank ZeRO-2/3, bad resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._cli_env import cli_env
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[3]
# A small, fast toy run: tiny Llama, 8 trajectories per step, 2-turn TokenGame.
FAST = [
    "env.kwargs={turns: 2, symbols: ABC, rule: copy, reward: all}",
    "trainer.batch_size=8",
    "deepspeed.micro_batch_size=4",
    "rollout.concurrency=8",
    "rollout.buffer_size=8",
    "run.progress=false",
    "run.plot=false",
    "run.tensorboard=false",
    "trainer.skip_uniform_reward_batches=false",  # every step trains, so the token accounting below holds
]

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]


def _sao(*args: str) -> list[str]:
    return [sys.executable, "-m", "sao.cli.main", *args]


def _steps(run_dir: Path) -> list[int]:
    p = run_dir / "metrics.jsonl"
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError):
            pass
    return out


def test_kill9_and_resume_keeps_the_books(tmp_path: Path) -> None:
    from sao.trainer.rollout.ledger import replay

    run = tmp_path / "run"
    args = ["train", str(ROOT / "configs/toy.yaml"), f"run.dir={run}", "run.total_steps=5", "run.save_every=2", *FAST]
    proc = subprocess.Popen(_sao(*args), env=cli_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 400
    # Kill after the step-2 checkpoint and at least one more step, so there is a lost branch to reconcile.
    while time.time() < deadline and (max(_steps(run), default=0) < 3 or not (run / "checkpoints/latest").exists()):
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before, _ = replay(run / "trajectories.jsonl")
    assert before.generated > 0
    res = subprocess.run(
        _sao("train", "--resume", str(run)), env=cli_env(), cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    acc, _ = replay(run / "trajectories.jsonl")
    assert acc.balanced(), acc
    assert acc.double_trained == []
    assert acc.generated >= before.generated
    assert acc.trained == 5 * 8
    assert _steps(run) == [1, 2, 3, 4, 5], "resumed metrics must continue the step counter"
    state = json.loads(
        (run / "checkpoints" / (run / "checkpoints/latest").read_text() / "trainer_state.json").read_text()
    )
    resumed = _resumed_versions_never_reused(run / "trajectories.jsonl")
    assert state["step"] == 5 and state["version"] == resumed + 3  # steps 3, 4 and 5 after the resume
    assert (run / "final/actor/model.safetensors").exists()


def _resumed_versions_never_reused(ledger: Path) -> int:
    """The resumed run went on under a version above every one the killed run used (its lost branch included), and
    everything it trained, lost-branch trajectories too, was within the bound (toy: 2) at its true lag."""
    from sao.agent.records import Trajectory
    from sao.trainer.rollout.ledger import replay
    from sao.trainer.rollout.versions import Lineage

    lines = [json.loads(x) for x in ledger.read_text().splitlines()]
    at = next(i for i, r in enumerate(lines) if r["type"] == "resume")
    resume = lines[at]
    used = [s["policy_version"] for r in lines[:at] if r["type"] == "trajectory"
            for s in r["trajectory"]["segments"] if s["policy_version"] is not None]  # fmt: skip
    used += [r["version"] + 1 for r in lines[:at] if r["type"] == "event" and r["event"] == "trained"]
    assert resume["from_step"] == 2 and resume["from_version"] == 2 and resume["next_version"] > max(used)
    acc, _ = replay(ledger)
    line = Lineage(acc.aliases)
    trajs = {r["uid"]: Trajectory.from_dict(r["trajectory"]) for r in lines if r["type"] == "trajectory"}
    lags = [line.distance(trajs[r["uid"]].oldest_policy_version or 0, r["version"])
            for r in lines[at:] if r["type"] == "event" and r["event"] == "trained"]  # fmt: skip
    assert len(lags) == 3 * 8 and max(lags) <= 2, lags
    return int(resume["next_version"])


def test_resume_with_another_config_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    from sao.trainer.config import load_config, save_config

    save_config(load_config(ROOT / "configs/toy.yaml", [f"run.dir={run}"]), run / "config.yaml")
    res = subprocess.run(
        _sao("train", str(ROOT / "configs/toy.yaml"), "--resume", str(run), "trainer.lr=0.1"),
        env=cli_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert "trainer.lr" in res.stderr and "saved config" in res.stderr
    res = subprocess.run(
        _sao("train", str(ROOT / "configs/toy.yaml"), f"run.dir={run}"),
        env=cli_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "--resume" in res.stderr


@pytest.mark.parametrize("stage", [2, 3])
def test_two_ranks_train_and_stay_identical(tmp_path: Path, stage: int) -> None:
    run = tmp_path / f"z{stage}"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        "-m", "sao.cli.main", "train", str(ROOT / "configs/toy.yaml"), f"run.dir={run}", "run.total_steps=2",
        f"deepspeed.zero_stage={stage}", "run.param_digest=true", *FAST,
    ]  # fmt: skip
    res = subprocess.run(cmd, env=cli_env(), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert _steps(run) == [1, 2]
    d0 = json.loads((run / "param_digest/rank0.json").read_text())
    d1 = json.loads((run / "param_digest/rank1.json").read_text())
    assert d0 == d1 and set(d0) == {"actor", "critic"}
    init = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert init["trained_tokens"] == 8 * 2
