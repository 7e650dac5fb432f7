"""SWE-bench-format records: eval script shape, validation errors, problem statements, pytest log parsing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sao.envs.swe.tasks.fetch import SdistSpec
from sao.envs.swe.tasks.instance import (
    eval_script,
    load_instances,
    problem_statement,
    validate_instance,
    with_official_image,
)
from sao.envs.swe.tasks.runner import failure_excerpts, parse_pytest


def record(**over: Any) -> dict[str, Any]:
    rec = {
        "instance_id": "pypi__demo-1.0-abc",
        "repo": "pypi/demo",
        "version": "1.0",
        "base_commit": "0" * 40,
        "problem_statement": "x fails",
        "patch": "diff --git a/m.py b/m.py\n",
        "test_patch": "",
        "FAIL_TO_PASS": ["tests/test_m.py::test_a"],
        "PASS_TO_PASS": ["tests/test_m.py::test_b"],
        "image": "sao-swe-demo:1.0-bug-000",
        "eval_script": eval_script("0" * 40, ["tests/test_m.py"]),
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
    }
    rec.update(over)
    return rec


def test_eval_script_feeds_the_official_test_spec() -> None:
    from swebench.harness.utils import make_test_spec

    spec = make_test_spec(record())
    script = spec.eval_script
    assert script.startswith("#!/bin/bash\nset -uxo pipefail\n")
    assert "SWEBENCH_TEST_EXIT_CODE=$?" in script  # the harness found our end marker
    assert "python -m pytest -p no:cacheprovider -rA --tb=short tests/test_m.py" in script
    assert spec.FAIL_TO_PASS == ["tests/test_m.py::test_a"]


def test_json_string_lists_are_accepted_like_the_hf_dataset() -> None:
    rec = record(FAIL_TO_PASS=json.dumps(["t.py::a"]), PASS_TO_PASS="[]")
    assert validate_instance(rec) is rec


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"image": ""}, "image must be a non-empty string"),
        ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS is empty"),
        ({"FAIL_TO_PASS": "not json"}, "not a JSON list"),
        ({"PASS_TO_PASS": [1, 2]}, "must be a list of test ids"),
        ({"log_parser": "parse_nothing"}, "unknown log_parser"),
        ({"eval_type": "sometimes"}, "eval_type must be one of"),
        ({"eval_script": "pytest"}, "Start/End Test Output"),
    ],
)
def test_bad_fields_are_named(over: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        validate_instance(record(**over))


def test_missing_fields_are_listed_with_the_fix() -> None:
    rec = record()
    del rec["eval_script"], rec["image"]
    with pytest.raises(ValueError, match=r"lacks field\(s\) image, eval_script.*sao tasks build"):
        validate_instance(rec)
    with pytest.raises(ValueError, match="JSON object"):
        validate_instance(["not", "a", "dict"])


def test_load_instances_names_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(record()) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:2: not valid JSON"):
        load_instances(p)
    p.write_text(json.dumps(record()) + "\n" + json.dumps(record(image="")) + "\n")
    with pytest.raises(ValueError, match=r"t\.jsonl:2: .*image"):
        load_instances(p)
    with pytest.raises(FileNotFoundError, match="sao tasks build"):
        load_instances(tmp_path / "nope.jsonl")


def test_problem_statement_names_tests_and_errors_only() -> None:
    f2p = ["tests/test_m.py::test_a", "tests/test_m.py::TestX::test_b"]
    text = problem_statement("demo", f2p, [("test_a", ["E   assert 3 == 4"])])
    assert "`test_a` and 1 other test fail in demo" in text
    assert all(f"`{t}`" in text for t in f2p)
    assert "E   assert 3 == 4" in text
    assert "diff --git" not in text


PYTEST_OUT = """\
______________________________ test_a ______________________________
    def test_a():
>       assert f(2) == 4
E       assert 3 == 4
E        +  where 3 = f(2)
tests/test_m.py:3: AssertionError
=========================== short test summary info ===========================
PASSED tests/test_m.py::test_b
PASSED tests/test_m.py::test_p[a b]
FAILED tests/test_m.py::test_a - assert 3 == 4
"""


def test_pytest_parsing_and_excerpts() -> None:
    status = parse_pytest(PYTEST_OUT)
    assert status == {"tests/test_m.py::test_b": "PASSED", "tests/test_m.py::test_a": "FAILED"}
    ex = failure_excerpts(PYTEST_OUT)
    assert ex == [("test_a", ["E       assert 3 == 4", "E        +  where 3 = f(2)"])]
    assert not any("assert f(2)" in line for _, lines in ex for line in lines)  # source lines stay out


def test_sdist_spec_parsing() -> None:
    s = SdistSpec.parse("More_Itertools==11.2.1")
    assert (s.name, s.version, s.slug) == ("more-itertools", "11.2.1", "more-itertools")
    with pytest.raises(ValueError, match="name==version"):
        SdistSpec.parse("click>=8")


def test_official_instances_get_the_published_image_name() -> None:
    rec = record(instance_id="django__django-11099")
    del rec["image"]
    assert with_official_image(rec)["image"] == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert with_official_image(record())["image"] == "sao-swe-demo:1.0-bug-000"


def test_a_location_hint_names_function_and_file_but_never_the_fix() -> None:
    from sao.envs.swe.tasks.instance import with_location_hint

    mutation = {"path": "demo/core.py", "function": "Box.scale", "operator": "comparison_flip"}
    rec = {"instance_id": "a", "problem_statement": "`test_a` fails in demo\n", "patch": "-x < 0\n+x <= 0\n",
           "sao_mutation": mutation}  # fmt: skip
    text = with_location_hint(rec)["problem_statement"]
    assert text.startswith("`test_a` fails in demo\n\n")
    assert "`scale` (`Box.scale`) in `demo/core.py`" in text and "x < 0" not in text and "comparison" not in text
    with pytest.raises(ValueError, match="not an offline SAO task naming its function"):
        with_location_hint({"instance_id": "b", "problem_statement": "x"})
    with pytest.raises(ValueError, match="unknown location hint 'lines'"):
        with_location_hint(rec, "lines")


PATCH = """diff --git a/demo/core.py b/demo/core.py
--- a/demo/core.py
+++ b/demo/core.py
@@ -40,5 +40,5 @@ def scale(self):
     a = 1

-    if x < 0:
+    if x <= 0:
         return a
"""


def test_a_line_hint_names_the_line_a_one_hunk_patch_rewrites_and_never_the_fix() -> None:
    from sao.envs.swe.tasks.instance import changed_lines, with_location_hint

    assert changed_lines(PATCH) == ("demo/core.py", 42, 42)
    assert changed_lines(PATCH.replace("-    if x < 0:\n", "-    if x < 0:\n-    y = 1\n")) == ("demo/core.py", 42, 43)
    assert changed_lines(PATCH + PATCH.split("\n", 1)[1]) is None  # two files (or hunks): no single place
    assert changed_lines(PATCH.replace("-    if x < 0:\n", "")) is None  # only adds lines
    mutation = {"path": "demo/core.py", "function": "Box.scale", "operator": "comparison_flip"}
    rec = {"instance_id": "a", "problem_statement": "`test_a` fails\n", "patch": PATCH, "sao_mutation": mutation}
    text = with_location_hint(rec, "line")["problem_statement"]
    assert text.endswith("`scale` (`Box.scale`) in `demo/core.py`. The bug is on line 42.\n")
    assert "x < 0" not in text and "<=" not in text
    assert "line 42" not in with_location_hint(rec)["problem_statement"]  # "function" names no line
    other = {**rec, "sao_mutation": {**mutation, "path": "demo/other.py"}}  # a patch elsewhere: no line
    assert "The bug is on" not in with_location_hint(other, "line")["problem_statement"]
