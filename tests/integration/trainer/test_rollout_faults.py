"""The rollout side failing under a whole `sao train` run (toy model, real DeepSpeed, every turn a command in a real
Docker sandbox on a private dockerd, see tests/_docker_token_game.py): the daemon gone for good stops the run with a
checkpoint and exit 75 (rollout.infra_stall_s) and the resume finishes it; a daemon restart is ridden through."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from sao.trainer.rollout.ledger import replay
from sao.trainer.runs.run_folder import latest_state
from tests._cli_env import cli_env
from tests.integration.sandboxes.test_daemon_restart import PrivateDockerd, dockerd  # noqa: F401 - the fixture
from tests.integration.trainer.test_runs import FAST, ROOT, _sao, _steps

pytestmark = [pytest.mark.docker, pytest.mark.deepspeed, pytest.mark.slow, pytest.mark.timeout(900)]

ENV = "env.id=tests._docker_token_game:sao/DockerTokenGame-v0"


def _args(run: Path, d: PrivateDockerd, steps: int, daemon_wait_s: float, *extra: str) -> list[str]:
    sandbox = f"{{backend: docker, image: sao-test-base:1, docker_host: '{d.url}', daemon_wait_s: {daemon_wait_s}}}"
    kwargs = f"env.kwargs={{turns: 2, symbols: ABC, rule: copy, reward: all, sandbox: {sandbox}}}"
    fast = [o for o in FAST if not o.startswith("env.kwargs=")]
    return ["train", str(ROOT / "configs/toy.yaml"), f"run.dir={run}", f"run.total_steps={steps}", ENV, kwargs, *fast,
            "run.save_every=100", *extra]  # fmt: skip


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(_sao(*args), env=cli_env(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def _wait_for_step(run: Path, step: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.time() + 400
    while max(_steps(run), default=0) < step:
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


def _records(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if "trajectory" in r]


def _check_the_books(run: Path, steps: int) -> list[dict[str, Any]]:
    """Balanced, each step's 8 trained once, no infra-error trajectory trained; returns the infra-error records."""
    acc, _ = replay(run / "trajectories.jsonl")
    assert acc.balanced(), acc
    assert acc.double_trained == [] and acc.trained == steps * 8
    assert _steps(run) == list(range(1, steps + 1))
    return [r for r in _records(run) if r["trajectory"]["status"] == "infra_error"]


def test_the_daemon_gone_for_good_stops_the_run_with_a_checkpoint_and_exit_75(dockerd: PrivateDockerd) -> None:  # noqa: F811
    run, log = dockerd.root / "run", dockerd.root / "sao.log"
    args = _args(run, dockerd, 4, 1, "rollout.infra_stall_s=5")
    proc = _start(args, log)
    try:
        _wait_for_step(run, 1, proc, log)
        dockerd.stop()  # for good: every sandbox call fails (after waiting 1 s for it to come back)
        t0 = time.time()
        code = proc.wait(180)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    print(f"stopped {took:.0f} s after the daemon went (rollout.infra_stall_s=5)")
    assert code == 75, out[-3000:]
    assert "the rollout side is gone" in out and "rollout.infra_stall_s=5" in out and "--resume" in out, out[-3000:]
    stopped_at = max(_steps(run))
    state = latest_state(run)
    assert state is not None
    assert state["step"] == stopped_at < 4 and not (run / "final").exists()
    infra = _check_the_books(run, stopped_at)
    assert len(infra) >= 16, "the stop came before max(16, 2 x concurrency) infra errors in a row"
    dockerd.start()  # the daemon is back: the resume finishes the run
    res = subprocess.run(_sao("train", "--resume", str(run)), env=cli_env(), cwd=ROOT, capture_output=True, timeout=600)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    _check_the_books(run, 4)


def test_a_daemon_restart_mid_run_is_ridden_through(dockerd: PrivateDockerd) -> None:  # noqa: F811
    run, log = dockerd.root / "run", dockerd.root / "sao.log"
    proc = _start(_args(run, dockerd, 4, 120), log)
    try:
        _wait_for_step(run, 1, proc, log)
        t0 = time.time()
        dockerd.stop()  # the episodes in flight lose their containers mid-command
        time.sleep(2)
        dockerd.start()
        outage = time.time() - t0
        code = proc.wait(400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log.read_text()[-3000:]
    infra = _check_the_books(run, 4)
    print(f"daemon away {outage:.1f} s: {len(infra)} infra errors, all from the restart")
    assert infra, "no episode in flight was recorded as an infra error"
    infos = [r["trajectory"]["info"] for r in infra]
    for info in infos:
        if not info["infra_error"].startswith("SandboxUnavailableError"):  # not wrapped by the sandbox layer
            print(info["infra_error"], info.get("traceback", ""))
    assert all("cannot be reached" in i["infra_error"] or "Connection" in i["infra_error"] for i in infos), infos
    assert (run / "final/actor/model.safetensors").exists()
