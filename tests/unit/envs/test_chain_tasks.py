"""Arithmetic chain tasks (levels 1-4): the generator, the solver's one-call-per-step episodes graded by the env,
the held-out draw stratified by level, and the scores per level."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
from envs_local_sandbox import LocalSandbox

from sao.agent.engines.solver import solver_action
from sao.agent.records import Segment, Trajectory
from sao.envs.datasets import arithmetic_chain_tasks, chain_levels, generated_eval_spec, load_tasks
from sao.envs.python_tool import PythonToolEnv
from sao.eval.scores import episode_scores, level_table

STEP = re.compile(r"^Step (\d+): (.+)$", re.M)


def evaluate(problem: str) -> tuple[int, list[int]]:
    """The chain's value computed here from the problem's text alone, with every intermediate."""
    values: list[int] = []
    for _, expr in STEP.findall(problem):
        values.append(int(eval(expr.replace("ANS", str(values[-1]) if values else "ANS"))))
    return values[-1], values


def test_chain_tasks_are_reproducible_with_the_level_visible_and_recorded() -> None:
    tasks = load_tasks("arithmetic_chain", num_generated=8, seed=3)
    assert tasks == load_tasks("arithmetic_chain", num_generated=8, seed=3)
    assert [t["problem"] for t in tasks] != [t["problem"] for t in load_tasks("arithmetic_chain", num_generated=8)]
    assert [t["level"] for t in tasks] == [1, 2, 3, 4, 1, 2, 3, 4]
    for t in tasks:
        assert t["problem"].startswith(f"Level {t['level']} of 4: {t['level']} step")
        assert [int(k) for k, _ in STEP.findall(t["problem"])] == list(range(1, t["level"] + 1))
    assert len({t["id"] for t in arithmetic_chain_tasks(400, seed=0)}) == 400
    assert [t["level"] for t in load_tasks("arithmetic_chain:1,4,4", num_generated=6)] == [1, 4, 4, 1, 4, 4]
    assert load_tasks("arithmetic_chain", num_generated=100, limit=3) == load_tasks("arithmetic_chain", num_generated=3)


def test_the_answer_is_the_chain_evaluated_step_by_step() -> None:
    tasks = arithmetic_chain_tasks(400, seed=5)
    for t in tasks:
        value, steps = evaluate(t["problem"])
        assert t["answer"] == str(value)
        assert all(0 < v < 10_000_000 for v in steps), t["problem"]  # positive, at most 7 digits
        assert len(set(steps)) > 1 or t["level"] == 1  # every later step changes the number
    ops = {expr.split()[1] for t in tasks for _, expr in STEP.findall(t["problem"])[1:]}
    assert ops == {"+", "-", "*", "//"}


@pytest.mark.parametrize(
    "spec", ["arithmetic_chain:", "arithmetic_chain:0,1", "arithmetic_chain:5", "arithmetic_chain:a"]
)
def test_a_bad_level_mix_says_what_is_accepted(spec: str) -> None:
    with pytest.raises(ValueError, match=r"comma-separated levels 1-4, e\.g\. 'arithmetic_chain:1,2,3,4'"):
        chain_levels(spec)


def test_held_out_tasks_come_from_every_level_whatever_the_training_mix() -> None:
    assert generated_eval_spec("arithmetic_chain:1,1,2") == "arithmetic_chain"
    assert generated_eval_spec("arithmetic") == generated_eval_spec(None) == "arithmetic"
    from sao.trainer.config import config_from_dict
    from sao.trainer.runs.stages import held_out_tasks

    cfg = config_from_dict(
        {"env": {"id": "sao/PythonTool-v0", "tasks": "arithmetic_chain:1,1,2", "num_tasks": 50}, "eval": {"n": 16}}
    )
    held = held_out_tasks(cfg)
    assert [t["level"] for t in held] == [1, 2, 3, 4] * 4
    assert not {t["problem"] for t in held} & {t["problem"] for t in load_tasks("arithmetic_chain:1,1,2", seed=0)}


@pytest.fixture()
def env(tmp_path: Path) -> PythonToolEnv:
    def factory() -> LocalSandbox:
        d = tmp_path / f"sb{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        return LocalSandbox(d)

    return PythonToolEnv(sandbox_factory=factory, code_timeout=10, max_steps=6)


def play(env: PythonToolEnv, task: dict[str, Any], act: Any = solver_action) -> tuple[float, dict[str, Any], int]:
    """One episode of ``act`` (text in, text out) on ``task``, the transcript in the chat template's text form."""
    obs, info = env.reset(options={"task": task})
    assert info["level"] == task["level"]
    text, calls = f"<|im_start|>user\n{obs}<|im_end|>\n", 0
    for _ in range(6):
        action = act(text + "<|im_start|>assistant\n")
        calls += action.startswith("<tool_call>")
        obs, reward, term, trunc, info = env.step(action)
        if term or trunc:
            return float(reward), dict(info), calls
        text += f"<|im_start|>assistant\n{action}<|im_end|>\n<|im_start|>user\n{obs}<|im_end|>\n"
    raise AssertionError("the episode did not end")


def test_the_solver_makes_one_call_per_step_and_the_env_grades_it_correct(env: PythonToolEnv) -> None:
    for task in arithmetic_chain_tasks(8, seed=11):
        reward, info, calls = play(env, task)
        assert (reward, info["solved"], calls) == (1.0, True, task["level"]), task["problem"]
        assert info["report"]["prediction"] == task["answer"]


def test_stopping_one_step_early_scores_zero(env: PythonToolEnv) -> None:
    task = arithmetic_chain_tasks(4, seed=2)[3]  # level 4
    _, steps = evaluate(task["problem"])

    def early(text: str) -> str:
        action = solver_action(text)
        return f"\\boxed{{{steps[-2]}}}" if text.count("</tool_call>") == 3 else action

    reward, info, calls = play(env, task, early)
    assert (reward, info["solved"], calls) == (0.0, False, 3)


def test_a_chain_answer_must_be_the_number_not_an_expression_equal_to_it(env: PythonToolEnv) -> None:
    task = arithmetic_chain_tasks(1, seed=4)[0]  # level 1: "Step 1: A * B"
    expr = STEP.findall(task["problem"])[0][1]
    for answer, solved in ((expr, False), (f"({expr})", False), (task["answer"], True), (f" {task['answer']} ", True)):
        env.reset(options={"task": task})
        _, reward, term, _, info = env.step(f"\\boxed{{{answer}}}")
        assert (reward, info["solved"], term) == (float(solved), solved, True), answer
        assert ("answer_format is integer" in info["report"].get("reason", "")) is not solved
    plain = {k: v for k, v in task.items() if k != "answer_format"}  # math-verify alone accepts the expression
    env.reset(options={"task": plain})
    assert env.step(f"\\boxed{{{expr}}}")[1] == 1.0
    with pytest.raises(ValueError, match="answer_format 'roman' is unknown; use one of \\['integer'\\]"):
        env.reset(options={"task": {**task, "answer_format": "roman"}})


def test_the_solver_reruns_a_step_whose_call_printed_no_number() -> None:
    head = "<|im_start|>user\nLevel 2 of 4: 2 steps. Run...\nStep 1: 120 * 12\nStep 2: ANS + 101\nGive...<|im_end|>\n"
    first = '<tool_call>{"name": "python", "arguments": {"code": "print(120 * 12)  # step 1 of 2"}}</tool_call>'
    assert solver_action(head) == first
    failed = f"{head}<|im_start|>assistant\n{first}<|im_end|>\n<|im_start|>user\nTraceback: boom<|im_end|>\n"
    assert solver_action(failed) == first
    done = failed.replace("Traceback: boom", "1440")
    assert (
        solver_action(done)
        == '<tool_call>{"name": "python", "arguments": {"code": "print(1440 + 101)  # step 2 of 2"}}</tool_call>'
    )
    second = done + "<|im_start|>assistant\n<tool_call>...</tool_call><|im_end|>\n<|im_start|>user\n1541\n<|im_end|>"
    assert solver_action(second) == "\\boxed{1541}"


class _Tok:
    """Decodes an action segment's one token id to its text (only what ``episode_scores`` asks of a tokenizer)."""

    texts: ClassVar[dict[int, str]] = {
        1: '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>',
        2: "no call at all",
    }

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.texts[ids[0]]


def _episode(task_id: str, level: int, solved: bool, action: int) -> Trajectory:
    info = {"solved": solved, "level": level, "tools": [{"function": {"name": "python"}}], "turns": 1}
    segs = (Segment("prompt", (9,)), Segment("action", (action,), (0.0,), 0, float(solved)))
    return Trajectory(task_id, "sao/PythonTool-v0", segs, float(solved), info=info)


def test_scores_per_level_and_the_paired_table() -> None:
    before = [_episode("a", 1, True, 1), _episode("b", 1, False, 2), _episode("c", 3, False, 1)]
    after = [_episode("a", 1, True, 1), _episode("b", 1, True, 1), _episode("c", 3, False, 1)]
    s0, s1 = episode_scores(before, _Tok()), episode_scores(after, _Tok())
    assert s0["by_level"] == {
        "1": {
            "episodes": 2,
            "tasks": 2,
            "success": 0.5,
            "success_se": pytest.approx(0.5 / 2**0.5),
            "valid_tool_call_rate": 0.5,
        },
        "3": {"episodes": 1, "tasks": 1, "success": 0.0, "success_se": 0.0, "valid_tool_call_rate": 1.0},
    }
    assert s0["level_by_task"] == {"a": 1, "b": 1, "c": 3}
    # the task records' level counts where an episode's info lacks one
    bare = [Trajectory("a", "e", before[0].segments, 1.0, info={"solved": True})]
    assert episode_scores(bare, _Tok(), [{"id": "a", "level": 2}])["by_level"]["2"]["success"] == 1.0
    assert "by_level" not in episode_scores(bare, _Tok())
    table = level_table([{**s0, "label": "after SFT"}, {**s1, "label": "after RL"}])
    assert "| after SFT | 0.500 ± 0.354 (0.50, n=2) | 0.000 ± 0.000 (1.00, n=1) |" in table
    assert "| after RL - after SFT (paired) | +0.500 ± 0.500 (n=2) | +0.000 ± 0.000 (n=1) |" in table
    assert level_table([{**episode_scores(bare, _Tok()), "label": "x"}]) == ""
