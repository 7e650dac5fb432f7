"""`sao collect` end to end: the solver on the Python-tool env (bwrap sandboxes, SmolLM2 tokenizer), resumed, read
back by `sao sft`'s loader and `sao pretrain-value`'s reader; infra errors written apart and retried."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests._require import missing

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def smollm2() -> str:
    from sao.core.paths import smollm2_dir

    if not (smollm2_dir() / "config.json").exists():
        missing("the converted SmolLM2-135M-Instruct", "run `bash scripts/setup.sh`")
    if shutil.which("bwrap") is None or subprocess.run(["bwrap", "--ro-bind", "/", "/", "true"]).returncode != 0:
        missing("a working bubblewrap", "apt-get install bubblewrap, or run `bash scripts/setup.sh`")
    return str(smollm2_dir())


def _collect(*args: str) -> Any:
    from sao.cli.main import app

    res = CliRunner().invoke(app, ["collect", *args])
    assert res.exit_code == 0, res.output + repr(res.exception)
    return res


def test_solver_episodes_are_written_resumed_and_readable(smollm2: str, tmp_path: Path) -> None:
    out = tmp_path / "col"
    common = ["--model", "solver", "--env", "sao/PythonTool-v0", "--tasks", "arithmetic", "--out", str(out)]
    res = _collect(*common, "--n", "3", "--concurrency", "2", "--max-tokens", "64")
    assert "collected 3/3 episodes (ok 3)" in res.output and "infra errors 0" in res.output
    res = _collect(*common, "--n", "5", "--concurrency", "2", "--max-tokens", "64")
    assert "collected 5/5" in res.output and "3 done before" in res.output
    lines = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(x["info"]["episode"] for x in lines) == [0, 1, 2, 3, 4]  # each index once: resumed, not redone
    assert all(x["reward"] == 1.0 and x["status"] == "ok" for x in lines)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 5 and summary["solved_rate"] == 1.0

    from transformers import AutoTokenizer

    from sao.trainer.learn.value_pretrain import read_rollouts
    from sao.trainer.sft.data import load_examples

    assert len(read_rollouts(out / "trajectories.jsonl")) == 5
    examples, stats = load_examples([str(out / "trajectories.jsonl")], AutoTokenizer.from_pretrained(smollm2),
                                    min_reward=1.0, max_len=2048)  # fmt: skip
    assert len(examples) == 5 and stats.kept == 5


def test_infra_errors_are_counted_apart_and_retried(smollm2: str, tmp_path: Path) -> None:
    out = tmp_path / "col"
    # A sandbox that cannot start (no such image): every episode is an infra error, never data.
    bad = json.dumps({"sandbox": {"backend": "docker", "image": "sao-no-such-image:0"}})
    res = _collect("--model", "solver", "--env", "sao/PythonTool-v0", "--tasks", "arithmetic", "--out", str(out),
                   "--n", "2", "--env-kwargs", bad)  # fmt: skip
    assert "collected 0/2 episodes" in res.output and "infra errors 2" in res.output
    assert not (out / "trajectories.jsonl").exists()
    infra = [json.loads(x) for x in (out / "infra_errors.jsonl").read_text().splitlines()]
    assert len(infra) == 2 and all(x["status"] == "infra_error" and x["info"]["infra_error"] for x in infra)
    res = _collect("--model", "solver", "--env", "sao/PythonTool-v0", "--tasks", "arithmetic", "--out", str(out),
                   "--n", "2", "--max-tokens", "64")  # fmt: skip
    assert "collected 2/2 episodes (ok 2), infra errors 0" in res.output  # the failed indices were retried


def test_bad_input_is_refused_with_the_fix(tmp_path: Path) -> None:
    from sao.cli.main import app

    res = CliRunner().invoke(app, ["collect", "--model", "nope:x", "--env", "sao/TokenGame-v0", "--n", "1",
                                   "--out", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 2 and "unknown model kind" in res.output
    res = CliRunner().invoke(app, ["collect", "--model", "solver", "--env", "sao/Nope-v0", "--n", "1",
                                   "--out", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 2 and "unknown env id" in res.output


@pytest.mark.docker
def test_docker_sandboxes_come_from_the_warm_pool_and_none_left(smollm2: str, base_image: str, tmp_path: Path) -> None:
    import os

    from sao.sandboxes.docker import OWNER_PID_LABEL, get_client

    sandbox = {"sandbox": {"backend": "docker", "image": base_image, "mem_limit": "256m"}}
    res = _collect("--model", "solver", "--env", "sao/PythonTool-v0", "--tasks", "arithmetic", "--out",
                   str(tmp_path / "col"), "--n", "6", "--concurrency", "3", "--max-tokens", "64",
                   "--env-kwargs", json.dumps(sandbox))  # fmt: skip
    assert "collected 6/6 episodes (ok 6), infra errors 0" in res.output
    left = get_client().api.containers(all=True, filters={"label": f"{OWNER_PID_LABEL}={os.getpid()}"})
    assert left == []
