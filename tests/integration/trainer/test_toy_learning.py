"""The toy run learns: TokenGame with a tiny random-init model reaches success >= 0.9 within a fixed budget. The run
is the README's toy command line, taken from the README and run through the CLI, so that line cannot rot."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests._readme import readme_command

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


def test_toy_sao_run_reaches_high_success(
    tmp_path: Path,
    deepspeed_env: dict[str, str],
    smollm2_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`sao train configs/toy.yaml` as the README has it (seed 0, steps of 16 episodes, algorithm sao): within the
    budget the success rate, averaged over 3 consecutive steps, reaches >= 0.9, from a start near random play (1/4).
    Measured: reached at steps 29-34 in four runs (seeds 0-2); one seed-2 run later fell back (reported in the
    trainer issue), which is why the check is "reaches within the budget" as the issue states it. The budget is the
    shipped 80 steps (~1 s each): a 45-step smoke failed in a CI rehearsal at load 5-10 (best 0.62: the copy found
    by step ~19 and lost at 22; resumed from its step-40 checkpoint to 80 it reached 0.9 at step 50), since the
    episodes' policy lag, and so the run, follows the machine's timing."""
    from sao.cli.main import app

    argv = shlex.split(readme_command("configs/toy.yaml"))  # `sao train configs/toy.yaml`
    assert argv[:2] == ["sao", "train"], argv
    run = tmp_path / "toy"
    monkeypatch.chdir(ROOT)  # the README's paths are relative to the repository root
    res = CliRunner().invoke(app, [*argv[1:], f"run.dir={run}", "run.progress=false"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["trainer"]["algorithm"] == "sao" and saved["critic"]["init"] == "actor"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, saved["run"]["total_steps"] + 1))
    curve = [round(r["success_rate"], 2) for r in rows]
    windows = [sum(r["success_rate"] for r in rows[i : i + 3]) / 3 for i in range(len(rows) - 2)]
    best = max(windows)
    assert best >= 0.9, f"best 3-step success {best:.2f} < 0.9 within {len(rows)} steps; curve {curve}"
    first = sum(r["success_rate"] for r in rows[:3]) / 3
    assert first < 0.6, f"the toy task must not be solved before training; curve {curve}"
    assert (run / "plots/curves.png").exists()
