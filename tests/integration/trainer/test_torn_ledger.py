"""A whole `sao train` run (toy model, real DeepSpeed) killed with SIGKILL, its ledger's last line torn by hand as a
kill in the middle of a write tears it, then `--resume` twice (tearing it again before the second): the books
balance after each. Before the appender repaired a torn tail, the first resume glued its resume marker onto the
fragment (a voided step's events stayed "trained") and the second died on the unreadable ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sao.core.jsonl import iter_jsonl
from tests._cli_env import cli_env
from tests.integration.trainer.test_runs import FAST, ROOT, _sao, _steps

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow, pytest.mark.timeout(600)]


def _tear(ledger: Path) -> bytes:
    """Append the first half of the ledger's last trajectory line, without its newline; returns what it appended."""
    last = [line for line in ledger.read_bytes().splitlines() if line.startswith(b'{"type": "trajectory"')][-1]
    fragment = last[: len(last) // 2]
    with open(ledger, "ab") as f:
        f.write(fragment)
    return fragment


def _resume(run: Path, *overrides: str) -> str:
    res = subprocess.run(
        _sao("train", "--resume", str(run), *overrides),
        env=cli_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stderr


def _check_books(run: Path, steps: int, resumes: int) -> None:
    from sao.trainer.rollout.ledger import replay

    ledger = run / "trajectories.jsonl"
    lines = [rec for _, rec in iter_jsonl(ledger)]  # strict: every line whole, the last one too
    assert len([r for r in lines if r["type"] == "resume"]) == resumes, "each resume marker is a line of its own"
    acc, _ = replay(ledger)
    assert acc.balanced(), acc
    assert acc.double_trained == []
    assert acc.trained == steps * 8, acc
    assert _steps(run) == list(range(1, steps + 1)), "resumed metrics must continue the step counter"
    state = json.loads(
        (run / "checkpoints" / (run / "checkpoints/latest").read_text() / "trainer_state.json").read_text()
    )
    assert state["step"] == steps


def test_a_torn_ledger_line_after_kill9_is_set_aside_and_two_resumes_keep_the_books(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["train", str(ROOT / "configs/toy.yaml"), f"run.dir={run}", "run.total_steps=4", "run.save_every=2", *FAST]
    proc = subprocess.Popen(_sao(*args), env=cli_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    # Kill after the step-2 checkpoint and one more step, so the resume voids a lost branch's events.
    while time.time() < deadline and (max(_steps(run), default=0) < 3 or not (run / "checkpoints/latest").exists()):
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    ledger = run / "trajectories.jsonl"
    fragments = [_tear(ledger)]
    err = _resume(run)
    assert "ended in a torn line" in err and str(ledger) in err, err[-3000:]
    _check_books(run, 4, resumes=1)

    fragments.append(_tear(ledger))
    _resume(run, "run.total_steps=6")
    _check_books(run, 6, resumes=2)
    sides = sorted(run.glob("trajectories.jsonl.torn-*"))
    assert [s.read_bytes() for s in sides] == fragments
