"""A crash or timeout of the math grader (math-verify) is an infra error, never a reward of 0 (issue 15, item 2)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from envs_local_sandbox import LocalSandbox

import sao.envs.python_tool as python_tool
from sao.envs.python_tool import GraderError, PythonToolEnv, grade_answer

# math-verify needs far more than a second to compare this tower with a number: a real grader timeout.
SLOW = "9^{9^{9^{9}}}"


@pytest.fixture()
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(python_tool, "GRADE_TIMEOUT_S", 1)


def test_a_grader_timeout_raises_instead_of_returning_false(short_timeout: None) -> None:
    with pytest.raises(GraderError, match="timed out"):
        grade_answer("7", SLOW)
    assert grade_answer("7", "7")[0] is True and grade_answer("7", "8")[0] is False


def test_a_grader_crash_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import math_verify

    def crash(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("sympy blew up")

    monkeypatch.setattr(math_verify, "verify", crash)
    with pytest.raises(GraderError, match="sympy blew up"):
        grade_answer("7", "7")


def test_unparseable_answers_stay_wrong_answers() -> None:
    for pred in ("abc", r"\frac{", "{}", r"\sqrt", "x ="):
        assert grade_answer("42", pred)[0] is False


def test_episode_with_a_grader_timeout_is_an_infra_error(tmp_path: Path, short_timeout: None) -> None:
    env = PythonToolEnv(sandbox_factory=lambda: LocalSandbox(tmp_path), code_timeout=10)
    try:
        env.reset(options={"task": {"id": "t", "problem": "2+5?", "answer": "7"}})
        call = json.dumps({"name": "submit", "arguments": {"answer": SLOW}})
        _, reward, terminated, truncated, info = env.step(f"<tool_call>{call}</tool_call>")
        assert truncated and not terminated and reward == 0.0
        assert "GraderError" in info["infra_error"] and "timed out" in info["infra_error"]
        assert "report" not in info
    finally:
        env.close()


def test_math_eval_sample_with_a_grader_timeout_is_an_infra_error(short_timeout: None) -> None:
    from sao.eval.math_eval import PlainAnswerEnv

    async def run() -> tuple[float, dict[str, Any]]:
        env = PlainAnswerEnv()
        await env.areset(options={"task": {"id": "p", "problem": "2+5?", "answer": "7"}})
        _, reward, _, truncated, info = await env.astep(rf"So the answer is \boxed{{{SLOW}}}.")
        assert truncated
        return reward, info

    reward, info = asyncio.run(run())
    assert reward == 0.0 and "GraderError" in info["infra_error"]
