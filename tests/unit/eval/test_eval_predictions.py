"""Predictions files for `sao eval swebench --grade-only`: every malformed case gets an error naming the line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sao.envs.swe.tasks.instance import eval_script
from sao.eval import swebench_eval as eval_swebench
from sao.eval.common import EvalError
from sao.eval.harness import load_predictions

IDS = {"demo__pkg-1", "demo__pkg-2"}


def record(iid: str) -> dict[str, Any]:
    return {
        "instance_id": iid, "repo": "demo/pkg", "version": "1.0", "base_commit": "abc123",
        "problem_statement": "it breaks", "patch": "", "test_patch": "",
        "FAIL_TO_PASS": ["tests/test_a.py::test_x"], "PASS_TO_PASS": [], "image": "sao-swe-demo:1",
        "eval_script": eval_script("abc123", ["tests/test_a.py"]), "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
    }  # fmt: skip


def pred(iid: str, patch: str | None = "diff --git a/x b/x\n") -> str:
    return json.dumps({"instance_id": iid, "model_name_or_path": "m", "model_patch": patch})


@pytest.mark.parametrize(
    ("lines", "where", "words"),
    [
        ([pred("demo__pkg-1"), "{not json"], ":2:", "not valid JSON"),
        ([pred("demo__pkg-1"), '["a list"]'], ":2:", "must be a JSON object"),
        (['{"instance_id": "demo__pkg-1", "model_patch": ""}'], ":1:", "missing key(s) model_name_or_path"),
        ([pred("demo__pkg-1"), "", pred("demo__pkg-9")], ":3:", "'demo__pkg-9' is not in the dataset"),
        ([pred("demo__pkg-1"), pred("demo__pkg-1")], ":2:", "appears again (first at"),
        (
            [json.dumps({"instance_id": "demo__pkg-1", "model_name_or_path": "m", "model_patch": 3})],
            ":1:",
            "unified diff",
        ),
    ],
)
def test_malformed_predictions_name_the_line(tmp_path: Path, lines: list[str], where: str, words: str) -> None:
    p = tmp_path / "preds.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(EvalError) as e:
        load_predictions(p, IDS, "tasks.jsonl")
    assert f"preds.jsonl{where}" in str(e.value) and words in str(e.value)


def test_good_predictions_jsonl_and_json(tmp_path: Path) -> None:
    p = tmp_path / "preds.jsonl"
    p.write_text(pred("demo__pkg-1") + "\n" + pred("demo__pkg-2", None) + "\n")
    assert [x["instance_id"] for x in load_predictions(p, IDS, "d")] == ["demo__pkg-1", "demo__pkg-2"]
    j = tmp_path / "preds.json"
    j.write_text(json.dumps({"demo__pkg-2": json.loads(pred("demo__pkg-2"))}))
    assert load_predictions(j, IDS, "d")[0]["model_patch"].startswith("diff")
    with pytest.raises(EvalError, match="no predictions"):
        (tmp_path / "empty.jsonl").write_text("\n")
        load_predictions(tmp_path / "empty.jsonl", IDS, "d")


def test_cli_grade_only_rejects_a_malformed_file_before_grading(tmp_path: Path) -> None:
    from sao.cli.main import app

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(record(i)) + "\n" for i in sorted(IDS)))
    preds = tmp_path / "preds.jsonl"
    preds.write_text(pred("demo__pkg-1") + "\n" + '{"instance_id": "demo__pkg-2"}\n')
    args = ["eval", "swebench", "--grade-only", str(preds), "--dataset", str(tasks), "--out", str(tmp_path / "o")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "preds.jsonl:2: missing key(s) model_name_or_path, model_patch" in res.output
    assert not (tmp_path / "o" / "harness").exists()


def test_instances_must_exist(tmp_path: Path) -> None:
    f = tmp_path / "tasks.jsonl"
    f.write_text(json.dumps(record("demo__pkg-1")) + "\n")
    assert [r["instance_id"] for r in eval_swebench.load_swe_dataset(str(f))] == ["demo__pkg-1"]
    with pytest.raises(EvalError, match="nope"):
        eval_swebench.load_swe_dataset(str(f), ("nope",))
