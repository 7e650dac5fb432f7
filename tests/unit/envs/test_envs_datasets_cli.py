"""Math task loading (benchmarks, local files, column errors), the arithmetic generator, and `sao envs`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sao.envs.datasets import arithmetic_tasks, load_math_tasks
from sao.envs.python_tool import grade_answer


def test_arithmetic_answers_are_right_and_reproducible() -> None:
    tasks = arithmetic_tasks(40, seed=3)
    assert tasks == arithmetic_tasks(40, seed=3) and tasks != arithmetic_tasks(40, seed=4)
    for t in tasks:
        expr = re.match(r"Compute (.+?)\. Use", t["problem"])
        assert expr is not None and eval(expr.group(1)) == int(t["answer"])


def test_local_csv_with_named_columns_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "mine.csv"
    f.write_text("q,a\nWhat is 1+1?,2\n")
    assert load_math_tasks(str(f), problem_key="q", answer_key="a") == [
        {"id": "mine-0", "problem": "What is 1+1?", "answer": "2"}
    ]
    with pytest.raises(ValueError, match="cannot find the problem column"):
        load_math_tasks(str(f))
    with pytest.raises(ValueError, match="no column 'ans'"):
        load_math_tasks(str(f), problem_key="q", answer_key="ans")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_math_tasks(str(tmp_path / "gone.jsonl"))


def test_imo_answerbench_loads_latex_answers() -> None:
    tasks = load_math_tasks("imo_answerbench", limit=3)
    assert tasks[0]["id"] == "imo-bench-algebra-001" and tasks[0]["answer"] == "3"
    assert tasks[1]["answer"].startswith("$\\left\\lfloor")
    assert grade_answer(tasks[1]["answer"], r"\lfloor \log_{2}a\rfloor + 1")[0]


def test_sao_envs_list_and_check() -> None:
    from sao.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["envs", "list"])
    assert res.exit_code == 0 and "sao/TokenGame-v0" in res.output and "sao/SWE-v0" in res.output
    res = runner.invoke(app, ["envs", "check", "sao/TokenGame-v0", "sao/OnlineWriting-v0"])
    assert res.exit_code == 0 and res.output.count("ok") >= 2
    res = runner.invoke(app, ["envs", "check", "sao/Nope-v0"])
    assert res.exit_code == 1 and "doesn't exist" in res.output
