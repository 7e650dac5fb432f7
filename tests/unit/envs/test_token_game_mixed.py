"""TokenGame's mixed rule: each task draws copy or next, the prompt names it, grading follows the task's rule."""

from __future__ import annotations

from typing import Any

import gymnasium
import pytest

import sao.envs  # noqa: F401 - registers the sao/ envs


def _env(**kw: Any) -> Any:
    return gymnasium.make("sao/TokenGame-v0", **{"turns": 2, "symbols": "ABC", "rule": "mixed", **kw}).unwrapped


def test_mixed_prompts_name_their_rule_and_grade_by_it() -> None:
    env = _env(reward="partial")
    obs, info = env.reset(options={"task": {"sequence": ["A", "C"], "rule": "next"}})
    assert "Rule next" in obs and info["rule"] == "next" and info["task_id"] == "next:A-C"
    _, r1, _, _, _ = env.step("B")  # after A comes B
    _, r2, term, _, last = env.step("C")  # after C comes A: wrong
    assert (r1, r2, term) == (0.5, 0.0, True) and last["report"]["rule"] == "next" and not last["solved"]
    obs, info = env.reset(options={"task": {"sequence": ["A", "C"], "rule": "copy"}})
    assert "Rule copy" in obs and info["rule"] == "copy"
    env.step("A")
    assert env.step("C")[4]["solved"]


def test_mixed_draws_both_rules_with_the_given_share() -> None:
    env = _env(next_share=0.25)
    rules = [env.reset(seed=s)[1]["rule"] for s in range(400)]
    assert 0.15 < rules.count("next") / len(rules) < 0.35
    assert {_env(next_share=0.0).reset(seed=s)[1]["rule"] for s in range(20)} == {"copy"}


def test_plain_rules_keep_their_prompt_and_refuse_another_rule() -> None:
    env = gymnasium.make("sao/TokenGame-v0", turns=1, symbols="AB", rule="copy").unwrapped
    obs, info = env.reset(seed=0)
    assert "Rule" not in obs and info["rule"] == "copy"
    with pytest.raises(ValueError, match="rule"):
        env.reset(options={"task": {"sequence": ["A"], "rule": "next"}})
    with pytest.raises(ValueError, match="next_share"):
        _env(next_share=2.0)
