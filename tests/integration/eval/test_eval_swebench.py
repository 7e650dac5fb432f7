"""`sao eval swebench` end to end on two offline tasks (real Docker, SWEEnv, swebench grading, official harness).

Scripted models: one applies each task's gold patch with the bash tool then submits (2/2 resolved), one submits
at once (0/2). The gold run is also resumed (finished instances are skipped) and its predictions are graded by
the official harness next to a patch that does not apply.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _call(name: str, **args: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def _script(path: Path, tasks: list[dict[str, Any]], gold: bool) -> str:
    with open(path, "w") as f:
        for r in tasks:
            b64 = base64.b64encode(r["patch"].encode()).decode()
            apply = _call("bash", command=f"echo {b64} | base64 -d > /tmp/fix.diff && git apply /tmp/fix.diff")
            actions = [apply, _call("submit")] if gold else [_call("submit")]
            f.write(json.dumps({"id": r["instance_id"], "actions": actions}) + "\n")
    return f"scripted:{path}"


def _eval(args: list[str]) -> Any:
    from sao.cli.main import app

    res = CliRunner().invoke(app, ["eval", "swebench", *args])
    assert res.exit_code == 0, res.output + repr(res.exception)
    return res


@pytest.fixture(scope="module")
def gold_run(eval_tasks: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The gold script on task A, then on A and B with the same --out (a resumed run: only B runs)."""
    tmp = tmp_path_factory.mktemp("gold")
    dataset = tmp / "tasks.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in eval_tasks))
    model = _script(tmp / "gold.jsonl", eval_tasks, gold=True)
    a, b = (r["instance_id"] for r in eval_tasks)
    common = ["--model", model, "--dataset", str(dataset), "--out", str(tmp / "out"), "--max-steps", "5"]
    _eval([*common, "--instances", a])
    first = json.loads((tmp / "out" / "report.json").read_text())
    res = _eval([*common, "--instances", f"{a},{b}"])
    second = json.loads((tmp / "out" / "report.json").read_text())
    return {"tmp": tmp, "dataset": dataset, "first": first, "report": second, "output": res.output, "common": common}


def test_gold_patches_resolve_both(gold_run: dict[str, Any], eval_tasks: list[dict[str, Any]]) -> None:
    rep, out = gold_run["report"], gold_run["tmp"] / "out"
    assert (rep["resolved"], rep["total"], rep["infra_errors"]) == (2, 2, 0)
    assert "resolved 2/2" in gold_run["output"]
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["instance_id"] for p in preds) == [r["instance_id"] for r in eval_tasks]
    for p in preds:
        assert set(p) == {"instance_id", "model_name_or_path", "model_patch"}
        assert p["model_patch"].startswith("diff --git")
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [t["info"]["turns"] for t in trajs] == [2, 2] and all(t["reward"] == 1.0 for t in trajs)


def test_resume_skips_finished_instances(gold_run: dict[str, Any]) -> None:
    out = gold_run["tmp"] / "out"
    assert gold_run["first"]["resolved"] == 1 and gold_run["report"]["skipped_already_done"] == 1
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    _eval(gold_run["common"])  # every instance is done: nothing runs, nothing is appended
    rep = json.loads((out / "report.json").read_text())
    assert rep["skipped_already_done"] == 2 and rep["resolved"] == 2
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 2


def test_submitting_nothing_resolves_none(eval_tasks: list[dict[str, Any]], tmp_path: Path) -> None:
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in eval_tasks))
    model = _script(tmp_path / "none.jsonl", eval_tasks, gold=False)
    res = _eval(["--model", model, "--dataset", str(dataset), "--out", str(tmp_path / "out"), "--workers", "2"])
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (rep["resolved"], rep["unresolved"], rep["infra_errors"]) == (0, 2, 0)
    assert "resolved 0/2" in res.output
    preds = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert [p["model_patch"] for p in preds] == ["", ""]


def test_grade_only_with_the_official_harness(gold_run: dict[str, Any], eval_tasks: list[dict[str, Any]]) -> None:
    tmp = gold_run["tmp"]
    preds = [json.loads(line) for line in (tmp / "out" / "predictions.jsonl").read_text().splitlines()]
    a, b = (r["instance_id"] for r in eval_tasks)
    bad = "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
    mixed = [next(p for p in preds if p["instance_id"] == a), {**next(p for p in preds if p["instance_id"] == b)}]
    mixed[1]["model_patch"] = bad
    path = tmp / "mixed.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in mixed))
    res = _eval(["--grade-only", str(path), "--dataset", str(gold_run["dataset"]), "--out", str(tmp / "graded")])
    rep = json.loads((tmp / "graded" / "report.json").read_text())
    assert rep["harness"]["verdicts"] == {a: "resolved", b: "unresolved"}, (rep["harness"]["errors"], res.output)
    assert (rep["resolved"], rep["unresolved"], rep["infra_errors"], rep["total"]) == (1, 1, 0, 2)
    assert "resolved 1/2" in res.output
    assert list((tmp / "graded" / "harness" / "logs" / "run_evaluation").iterdir())  # the harness's own logs
