"""What a small-context SWE job relies on: observations cut with a visible marker, a sampled training reward."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sao.envs.swe.env import SWEEnv, cut_lines
from sao.envs.swe.tasks.instance import eval_script, validate_instance, with_test_sample


def test_long_output_keeps_head_and_tail_around_a_marker() -> None:
    text = "\n".join(f"line {i}" for i in range(100))
    out = cut_lines(text, 10, 400).split("\n")
    assert out[:5] == [f"line {i}" for i in range(5)] and out[-5:] == [f"line {i}" for i in range(95, 100)]
    assert out[5] == "... 90 lines omitted ..." and len(out) == 11
    assert cut_lines("a\nb", 10, 400) == "a\nb"  # short output is untouched
    wide = cut_lines("x" * 50 + "y" * 50, 10, 40)
    assert wide == "x" * 20 + " ... 60 chars omitted ... " + "y" * 20


def _offline(**over: Any) -> dict[str, Any]:
    base = "0" * 40
    rec = {
        "instance_id": "pypi__demo-1.0-abc",
        "repo": "pypi/demo",
        "version": "1.0",
        "base_commit": base,
        "problem_statement": "x fails",
        "patch": "diff --git a/m.py b/m.py\n",
        "test_patch": "",
        "FAIL_TO_PASS": ["tests/test_m.py::test_a"],
        "PASS_TO_PASS": [f"tests/test_m.py::test_p{i}" for i in range(6)] + ["tests/test_n.py::test_q[1-2]"],
        "image": "sao-swe-demo:1.0-bug-000",
        "eval_script": eval_script(base, ["tests/test_m.py", "tests/test_n.py"]),
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "sao_mutation": {"operator": "off_by_one", "path": "m.py"},
    }
    rec.update(over)
    return rec


def test_a_sampled_reward_runs_only_fail_to_pass_and_the_sample() -> None:
    from swebench.harness.utils import make_test_spec

    rec = _offline()
    fast = with_test_sample(rec, ["tests/test_n.py::test_q[1-2]"])
    validate_instance(fast)
    script = make_test_spec(fast).eval_script
    assert "--tb=short tests/test_m.py::test_a 'tests/test_n.py::test_q[1-2]'" in script
    assert "test_p0" not in script and fast["PASS_TO_PASS"] == ["tests/test_n.py::test_q[1-2]"]
    assert rec["PASS_TO_PASS"][0] == "tests/test_m.py::test_p0"  # the task itself is unchanged
    with pytest.raises(ValueError, match="not PASS_TO_PASS"):
        with_test_sample(rec, ["tests/test_m.py::nope"])
    official = {k: v for k, v in rec.items() if k != "sao_mutation"}
    with pytest.raises(ValueError, match="not an offline SAO task"):
        with_test_sample(official, [])


def test_the_env_draws_its_sample_from_its_seeded_generator() -> None:
    env = SWEEnv(pass_to_pass_sample=3)
    env._np_random = np.random.default_rng(0)
    a = env._graded_task(_offline())["PASS_TO_PASS"]
    env._np_random = np.random.default_rng(0)
    assert env._graded_task(_offline())["PASS_TO_PASS"] == a and len(a) == 3
    assert SWEEnv()._graded_task(_offline())["PASS_TO_PASS"] == _offline()["PASS_TO_PASS"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_obs_lines": 1}, "max_obs_lines"), ({"pass_to_pass_sample": -1}, "pass_to_pass_sample")],
)
def test_bad_small_context_settings_are_named(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SWEEnv(**kwargs)


def test_a_sampled_reward_refuses_tasks_it_cannot_cut() -> None:
    env = SWEEnv(pass_to_pass_sample=2)
    official = {k: v for k, v in _offline().items() if k != "sao_mutation"}
    with pytest.raises(ValueError, match="pass_to_pass_sample to null"):
        env.parse_task(official)
