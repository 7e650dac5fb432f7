"""PythonToolEnv on a local sandbox: AIME-style grading, tool turns, limits, infra errors, bad tasks, check_env."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest
from envs_local_sandbox import LocalSandbox
from gymnasium.utils.env_checker import check_env

import sao.envs  # noqa: F401 - registers the ids
from sao.envs.python_tool import PythonToolEnv, grade_answer, last_boxed

TASK = {"id": "t1", "problem": "What is 6*7?", "answer": "42"}


def call(name: str, **args: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


@pytest.fixture()
def make_env(tmp_path: Path):
    made: list[LocalSandbox] = []

    def factory() -> LocalSandbox:
        d = tmp_path / f"sb{len(made)}"
        d.mkdir()
        made.append(LocalSandbox(d))
        return made[-1]

    def make(**kw: object) -> PythonToolEnv:
        return PythonToolEnv(sandbox_factory=factory, code_timeout=10, **kw)  # type: ignore[arg-type]

    make.sandboxes = made  # type: ignore[attr-defined]
    return make


def test_last_boxed_takes_the_last_balanced_box() -> None:
    assert last_boxed(r"first \boxed{1} then \boxed{\frac{3}{4}}.") == r"\frac{3}{4}"
    assert last_boxed(r"\boxed{a} \boxed{unclosed") == "a"
    assert last_boxed("no box") is None


@pytest.mark.parametrize(
    ("gold", "pred", "ok"),
    [
        ("204", "204", True),
        ("204", "205", False),
        (r"\frac{1}{2}", "0.5", True),
        ("0.75", r"\frac{3}{4}", True),
        ("033", "33", True),
        (r"\frac{m}{n}", "x", False),
    ],
)
def test_grade_answer_uses_math_verify(gold: str, pred: str, ok: bool) -> None:
    assert grade_answer(gold, pred)[0] is ok


def test_aime_gold_answers_boxed_score_one(make_env) -> None:
    from sao.envs.datasets import load_math_tasks

    tasks = load_math_tasks("aime24", limit=5)
    env = make_env(dataset=tasks)
    for seed in range(3):
        _, info = env.reset(seed=seed)
        task = next(t for t in tasks if t["id"] == info["task_id"])
        _, r, term, trunc, info = env.step(f"So the answer is \\boxed{{{task['answer']}}}.")
        assert (r, term, trunc, info["solved"]) == (1.0, True, False, True)
        env.reset(seed=seed)
        _, r, *_ = env.step(f"\\boxed{{{int(task['answer']) + 1}}}")
        assert r == 0.0


def test_python_turns_then_submit(make_env) -> None:
    env = make_env()
    obs, info = env.reset(options={"task": TASK})
    assert obs == TASK["problem"] and info["task_id"] == "t1"
    assert {t["function"]["name"] for t in info["tools"]} == {"python", "submit"}
    obs, _, term, _, info = env.step(call("python", code="x = 6 * 7\nx"))
    assert obs.strip() == "42" and info["role"] == "tool" and info["exit_code"] == 0 and not term
    obs, *_ = env.step("```python\nprint(x + 1)\n```")  # fenced block = python call, state kept
    assert obs.strip() == "43"
    _, r, term, _, info = env.step(call("submit", answer="42"))
    assert r == 1.0 and term and info["report"]["gold"] == "42"
    assert make_env.sandboxes[0].closed  # released when the episode ends


def test_format_error_limit_truncates(make_env) -> None:
    env = make_env(max_format_errors=2)
    env.reset(options={"task": TASK})
    obs, _, _, trunc, info = env.step("I think about it")
    assert info["format_error"] and not trunc and "<tool_call>" in obs
    _, _, term, trunc, info = env.step(call("nope"))
    assert trunc and not term and info["truncation_reason"] == "format_errors" and info["solved"] is False


def test_step_limit_truncates(make_env) -> None:
    env = make_env(max_steps=2)
    env.reset(options={"task": TASK})
    assert env.step(call("python", code="1"))[3] is False
    _, r, term, trunc, info = env.step(call("python", code="2"))
    assert (r, term, trunc, info["truncation_reason"]) == (0.0, False, True, "step_limit")


def test_time_limit_truncates(make_env) -> None:
    env = make_env(max_wall_s=1.0)
    env.reset(options={"task": TASK})
    _, _, _, trunc, info = env.step(call("python", code="import time\ntime.sleep(3)"))
    assert trunc and info["truncation_reason"] == "time_limit"


def test_sandbox_failure_is_an_infra_error_not_a_zero(make_env) -> None:
    env = make_env()
    env.reset(options={"task": TASK})
    make_env.sandboxes[0].fail = True
    _, r, term, trunc, info = env.step(call("python", code="1"))
    assert trunc and not term and r == 0.0 and "SandboxError" in info["infra_error"]


def test_malformed_task_names_the_missing_field(make_env) -> None:
    env = make_env()
    with pytest.raises(ValueError, match="missing field 'answer'"):
        env.reset(options={"task": {"problem": "2+2?"}})
    with pytest.raises(ValueError, match="missing field 'problem'"):
        env.reset(options={"task": {"answer": "4"}})


def test_unknown_env_id_is_a_clear_error() -> None:
    with pytest.raises(gym.error.Error, match="Nope"):
        gym.make("sao/Nope-v0")


def test_check_env_with_local_sandbox(make_env) -> None:
    env = make_env(max_steps=3)
    check_env(env, skip_render_check=True)
    env.close()
