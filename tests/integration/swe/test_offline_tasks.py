"""The offline task set: real bugs from two packages, graded by our grader and by the official swebench harness."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sao.envs.swe.grading import grade_patch
from sao.envs.swe.tasks import validate_instance

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_tasks_come_from_two_packages_and_read_like_issues(offline_tasks: list[dict[str, Any]]) -> None:
    assert len({t["repo"] for t in offline_tasks}) >= 2
    ids = [t["instance_id"] for t in offline_tasks]
    assert len(set(ids)) == len(ids)
    for t in offline_tasks:
        validate_instance(t)
        assert t["FAIL_TO_PASS"] and all("::" in x for x in t["FAIL_TO_PASS"] + t["PASS_TO_PASS"])
        assert not set(t["FAIL_TO_PASS"]) & set(t["PASS_TO_PASS"])
        plus = [ln for ln in t["patch"].splitlines() if ln.startswith("+") and not ln.startswith("+++")]
        fixed_lines = [ln[1:].strip() for ln in plus]
        statement = t["problem_statement"]
        assert "diff --git" not in statement and t["sao_mutation"]["description"] not in statement
        # The fixed code is never shown.
        assert not any(line in statement for line in fixed_lines if len(line) >= 12)
        assert all(f"`{x}`" in statement for x in t["FAIL_TO_PASS"][:15])


def test_gold_resolves_and_a_wrong_patch_does_not(offline_tasks: list[dict[str, Any]]) -> None:
    task = offline_tasks[0]
    gold = grade_patch(task, task["patch"])
    assert gold.resolved, gold.log[-3000:]
    status = gold.report[task["instance_id"]]["tests_status"]
    assert sorted(status["FAIL_TO_PASS"]["success"]) == sorted(task["FAIL_TO_PASS"])
    unrelated = (
        "diff --git a/NOTES.txt b/NOTES.txt\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES.txt\n@@ -0,0 +1 @@\n+hi\n"
    )
    wrong = grade_patch(task, unrelated)
    assert wrong.applied and not wrong.resolved
    assert wrong.report[task["instance_id"]]["tests_status"]["FAIL_TO_PASS"]["failure"]


def test_official_harness_resolves_every_gold_patch(offline_tasks: list[dict[str, Any]], tmp_path: Path) -> None:
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text("".join(json.dumps(t) + "\n" for t in offline_tasks))
    cmd = [
        sys.executable,
        "-m",
        "swebench.harness.run_evaluation",
        "-d",
        str(dataset),
        "-p",
        "gold",
        "-id",
        "sao-gold",
        "--max_workers",
        "2",
        "--report_dir",
        str(tmp_path),
        "-t",
        "600",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gold.sao-gold.json").read_text())
    assert sorted(report["resolved_ids"]) == sorted(t["instance_id"] for t in offline_tasks), report
    assert report["error_instances"] == 0
