"""`sao eval math` end to end: 5 AIME 2025 problems with a scripted model right on 3; the python tool on bwrap."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests._require import missing


@pytest.fixture(scope="module")
def aime5() -> list[dict[str, str]]:
    from sao.envs.datasets import load_math_tasks

    return load_math_tasks("aime25", limit=5)  # shipped in the package: never skipped


def _run(args: list[str]) -> Any:
    from sao.cli.main import app

    res = CliRunner().invoke(app, ["eval", "math", *args])
    assert res.exit_code == 0, res.output + repr(res.exception)
    return res


def test_three_of_five_right_is_accuracy_0_6(aime5: list[dict[str, str]], tmp_path: Path) -> None:
    script = tmp_path / "script.jsonl"
    with open(script, "w") as f:
        for i, t in enumerate(aime5):
            # Right (boxed gold) for the first 3; a wrong number and an unboxed reply for the others.
            reply = f"So the answer is $\\boxed{{{t['answer']}}}$." if i < 3 else ("\\boxed{1}" if i == 3 else "42")
            f.write(json.dumps({"id": t["id"], "actions": [reply]}) + "\n")
    out = tmp_path / "out"
    res = _run(["--model", f"scripted:{script}", "--dataset", "aime25", "--limit", "5", "--tools", "none",
                "--samples", "2", "--out", str(out)])  # fmt: skip
    rep = json.loads((out / "report.json").read_text())
    assert rep["accuracy"] == pytest.approx(0.6) and rep["avg@2"] == pytest.approx(0.6)
    assert rep["pass@1"] == pytest.approx(0.6) and rep["pass@2"] == pytest.approx(0.6)
    assert rep["infra_errors"] == 0 and rep["problems_graded"] == 5
    rows = list(csv.DictReader((out / "problems.csv").read_text().splitlines()))
    assert [r["correct"] for r in rows] == ["2", "2", "2", "0", "0"]
    assert rows[3]["predictions"] == "1 | 1"
    assert len((out / "samples.jsonl").read_text().splitlines()) == 10
    assert "avg@2 0.600" in res.output


def test_python_tool_episode_on_bwrap(aime5: list[dict[str, str]], tmp_path: Path) -> None:
    if shutil.which("bwrap") is None:
        missing("bubblewrap (bwrap)", "apt-get install bubblewrap, or run `bash scripts/setup.sh`")
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        missing("a working bubblewrap", probe.stderr.strip())
    t = aime5[0]
    # The python tool prints the answer; the boxed reply is graded. A second problem submits a wrong answer.
    actions = [f"```python\nprint({t['answer']})\n```", f"It printed it: \\boxed{{{t['answer']}}}"]
    wrong = ['<tool_call>{"name": "submit", "arguments": {"answer": "-5"}}</tool_call>']
    script = tmp_path / "script.jsonl"
    script.write_text(
        json.dumps({"id": t["id"], "actions": actions}) + "\n" + json.dumps({"id": aime5[1]["id"], "actions": wrong})
    )
    out = tmp_path / "out"
    _run(
        ["--model", f"scripted:{script}", "--dataset", "aime25", "--limit", "2", "--tools", "python", "--out", str(out)]
    )
    rep = json.loads((out / "report.json").read_text())
    assert [p["correct"] for p in rep["problems"]] == [1, 0] and rep["infra_errors"] == 0
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    traj = next(x for x in trajs if x["task_id"] == t["id"])
    msgs = [m for m in traj["info"]["messages"] if m["role"] != "system"]
    assert t["answer"] in msgs[2]["content"]  # the tool's real output came back to the model
