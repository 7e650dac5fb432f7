"""The SWE demonstrator's script from a gold patch, driven through the real episode loop by a scripted env."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agent_fakes import CharChatMLTokenizer, ScriptedEnv

from sao.agent.engines.protocols import EngineError
from sao.agent.engines.registry import make_demonstrator
from sao.agent.engines.swe_demonstrator import next_call, parse_patch, unshown_steps
from sao.agent.loop import AgentConfig, run_episode

TOK = CharChatMLTokenizer()
PATCH = """diff --git a/pkg/m.py b/pkg/m.py
index 1..2 100644
--- a/pkg/m.py
+++ b/pkg/m.py
@@ -10,7 +10,7 @@ def f(x):
     a = 1
     b = 2

-    if x < 0:
+    if x >= 0:
         return a
     c = 3
     return b
"""


def task(**over: Any) -> dict[str, Any]:
    rec = {
        "instance_id": "pypi__demo-1.0-abc",
        "problem_statement": "`test_f` fails in demo\n",
        "patch": PATCH,
        "FAIL_TO_PASS": ["tests/test_m.py::test_f", "tests/test_m.py::test_g"],
    }
    rec.update(over)
    return rec


def test_a_patch_becomes_hunks_with_short_and_full_edits() -> None:
    (h,) = parse_patch(PATCH)
    assert h.path == "pkg/m.py" and h.start == 10 and h.pre_len == 7
    assert h.texts(context=1) == ("\n    if x < 0:\n        return a", "\n    if x >= 0:\n        return a")
    old, new = h.texts(context=None)
    assert old.startswith("    a = 1\n    b = 2\n\n    if x < 0:") and new.endswith("    c = 3\n    return b")
    assert h.line_texts() == ("if x < 0:", "if x >= 0:")  # one rewritten line: no indentation, no context
    assert h.edits() == [("if x < 0:", "if x >= 0:"), h.texts(context=1), (old, new)]
    two = parse_patch(PATCH.replace("-    if x < 0:", "-    if x < 0:\n-    d = 4"))[0]
    assert two.line_texts() is None and two.edits()[0] == two.texts(context=1)
    with pytest.raises(EngineError, match="more than edit files"):
        parse_patch("diff --git a/n.py b/n.py\nnew file mode 100644\n")


GREP = "pkg/m.py:9:def f(x):\npkg/m.py:40:    def f(y):\ntests/test_m.py:3:def f(z):"
TRACEBACK = "pkg/m.py:12: in f\n    if x < 0:\nE   TypeError\n1 failed"


def _script(t: dict[str, Any], answers: list[str | None]) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    observations: list[str] = []
    for obs in answers:
        calls.append(next_call(t, observations))
        if obs is not None:
            observations.append(obs)
    return calls


def test_the_script_reproduces_locates_fixes_checks_and_submits() -> None:
    # the traceback names f: grep its definition at once; grep finds three, the one in the hunk's file above the
    # change (line 9) is the one it is in
    calls = _script(
        task(), [TRACEBACK, GREP, "Here is pkg/m.py", "The file pkg/m.py was edited. Lines ...", "2 passed", None]
    )
    names = [(c["name"], c["arguments"].get("command", "")) for c in calls]
    assert names[0] == ("bash", "python -m pytest -q --tb=short tests/test_m.py::test_f")
    assert names[1] == ("bash", "grep -rn --include='*.py' 'def f(' *")  # the hunk header names the function
    assert names[2:4] == [("str_replace_editor", "view"), ("str_replace_editor", "str_replace")]
    assert calls[2]["arguments"] == {"command": "view", "path": "pkg/m.py", "view_range": [9, 16]}
    assert names[4][1].endswith("tests/test_m.py::test_f tests/test_m.py::test_g") and names[5] == ("submit", "")
    # a grep that finds nothing in the hunk's file (or a header without a function) views a few lines above it
    assert next_call(task(), [TRACEBACK, "tests/test_m.py:3:def f(z):"])["arguments"]["view_range"] == [6, 16]
    bare = task(patch=PATCH.replace(" def f(x):", ""))
    assert next_call(bare, ["1 failed"])["arguments"] == {"command": "view", "path": "pkg/m.py", "view_range": [6, 16]}


def test_a_traceback_without_the_function_shows_the_test_source_first_and_every_step_is_copied() -> None:
    wrong = "E   assert 3 == 2\n1 failed"  # a wrong result: the traceback names only the test
    source = "7:def test_f():\n8-    assert f(-1) == 2"
    calls = _script(
        task(), [wrong, source, GREP, "Here is pkg/m.py", "The file pkg/m.py was edited.", "2 passed", None]
    )
    assert calls[1]["arguments"]["command"] == "grep -n -A 12 'def test_f(' tests/test_m.py"
    assert calls[2]["arguments"]["command"] == "grep -rn --include='*.py' 'def f(' *"
    assert calls[3]["arguments"]["path"] == "pkg/m.py" and [c["name"] for c in calls][-1] == "submit"
    observations = [wrong, source, GREP, "Here is pkg/m.py", "The file pkg/m.py was edited.", "2 passed"]
    assert unshown_steps(task(), calls, observations) == []  # f shown by the test, pkg/m.py by grep
    # a test that calls f only through another function: the grep for f is a step nothing showed
    hidden = ["1 failed", "7:def test_f():\n8-    assert g(-1) == 2", GREP, "Here is", "The file pkg/m.py was edited."]
    assert unshown_steps(task(), _script(task(), hidden), hidden) == ["f"]
    # a parametrized test in a class: the grep names the bare test function in its file
    param = task(FAIL_TO_PASS=["tests/test_m.py::TestF::test_f[neg-1]"])
    assert next_call(param, [wrong])["arguments"]["command"] == "grep -n -A 12 'def test_f(' tests/test_m.py"


def test_the_function_grepped_is_the_one_the_bug_is_in() -> None:
    # git's header names the last top-level def above the hunk: a def among the context lines above the change is
    # nearer (and a method's header names none); the record's sao_mutation, when there is one, names it outright
    inner = PATCH.replace("     b = 2\n", "     def g(y):\n")
    assert parse_patch(inner)[0].function == "g" and parse_patch(PATCH)[0].function == "f"
    assert parse_patch(PATCH.replace(" def f(x):", ""))[0].function is None
    assert next_call(task(patch=inner), ["in g"])["arguments"]["command"] == "grep -rn --include='*.py' 'def g(' *"
    named = task(sao_mutation={"function": "Box.area"})
    assert next_call(named, ["in area"])["arguments"]["command"] == "grep -rn --include='*.py' 'def area(' *"


def test_a_refused_short_edit_is_retried_longer_then_with_the_whole_hunk_then_gives_up() -> None:
    obs = [TRACEBACK, GREP, "Here is", "No replacement: old_str appears 2 times"]
    assert next_call(task(), obs[:3])["arguments"]["old_str"] == "if x < 0:"
    assert next_call(task(), obs)["arguments"]["old_str"] == "\n    if x < 0:\n        return a"
    retry = next_call(task(), [*obs, "No replacement: again"])
    assert retry["arguments"]["old_str"].startswith("    a = 1")
    with pytest.raises(EngineError, match="refused the gold edit"):
        next_call(task(), [*obs, "No replacement: again", "No replacement: still"])


def test_an_issue_naming_the_line_is_viewed_there_and_a_refused_edit_widens_the_view_first() -> None:
    hint = "`test_f` fails\n\nThe failure traces back to the function `f` in `pkg/m.py`. The bug is on line 13.\n"
    named = task(problem_statement=hint)
    (h,) = parse_patch(PATCH)
    assert h.pre_lines(0) == (13, 13) and h.pre_lines(1) == (12, 14) and h.pre_lines(None) == (10, 16)
    assert h.named_in(hint) and not h.named_in(hint.replace("line 13", "line 12"))
    assert not h.named_in(hint.replace("`pkg/m.py`", "`pkg/n.py`"))
    answers = ["1 failed", "13\t    if x < 0:", "The file pkg/m.py was edited.", "2 passed", None]
    calls = _script(named, answers)
    assert [c["name"] for c in calls] == ["bash", "str_replace_editor", "str_replace_editor", "bash", "submit"]
    assert calls[1]["arguments"] == {"command": "view", "path": "pkg/m.py", "view_range": [13, 13]}  # no grep
    assert calls[2]["arguments"]["old_str"] == "if x < 0:" and calls[2]["arguments"]["new_str"] == "if x >= 0:"
    observations = [a for a in answers if a is not None]
    assert unshown_steps(named, calls, observations) == []  # the issue shows the path
    # refused (the line is not unique): a view of the lines the longer form holds, then that form
    refused = ["1 failed", "13\t    if x < 0:", "No replacement: old_str appears 2 times"]
    assert next_call(named, refused)["arguments"] == {"command": "view", "path": "pkg/m.py", "view_range": [12, 14]}
    assert next_call(named, [*refused, "12\t\n..."])["arguments"]["old_str"] == "\n    if x < 0:\n        return a"
    widest = next_call(named, [*refused, "12\t\n...", "No replacement: again"])
    assert widest["arguments"]["view_range"] == [10, 16]
    # two changed lines: "lines A-B", viewed whole (the one-line form does not exist)
    two = PATCH.replace("+    if x >= 0:\n", "+    if x >= 0:\n-    d = 4\n")
    two_hint = hint.replace("line 13.", "lines 13-14.")
    assert parse_patch(two)[0].named_in(two_hint)
    assert next_call(task(patch=two, problem_statement=two_hint), ["1 failed"])["arguments"]["view_range"] == [12, 15]


async def test_episodes_through_the_loop_are_tool_calls_for_the_prompts_task() -> None:
    other = task(instance_id="other", problem_statement="something else\n", patch=PATCH.replace("x < 0", "x < 1"))
    engine = make_demonstrator("swe_demonstrator", TOK, [other, task()])
    prompt = "<issue>\n`test_f` fails in demo\n</issue>\n\nThe repository is checked out at /testbed."
    steps = [("1 failed", 0.0, False, False, {"role": "tool"})] * 5 + [("Submitted.", 1.0, True, False, {})]
    env = ScriptedEnv(steps, task=prompt)
    env.steps[0] = ("pkg/m.py:12: in f\n1 failed", 0.0, False, False, {"role": "tool"})  # names f: no test source
    env.steps[3] = ("The file pkg/m.py was edited. Lines 12-13 now read: ...", 0.0, False, False, {})
    traj = await run_episode(env, engine, TOK, AgentConfig(max_context_tokens=8192, max_action_tokens=400))
    calls = [json.loads(a.removeprefix("<tool_call>").removesuffix("</tool_call>")) for a in env.actions]
    assert [c["name"] for c in calls] == ["bash", "bash", "str_replace_editor", "str_replace_editor", "bash", "submit"]
    assert calls[3]["arguments"]["new_str"] == "if x >= 0:"  # this task's fix, not other's
    assert traj.status == "ok" and traj.reward == 1.0
    assert all(lp == 0.0 for seg in traj.action_segments for lp in seg.logprobs or ())
    lone = make_demonstrator("swe_demonstrator", TOK, [other])  # a task it does not know: an infra error
    traj = await run_episode(ScriptedEnv(steps, task=prompt), lone, TOK, AgentConfig())
    assert traj.status == "infra_error" and "none of the tasks" in traj.info["infra_error"]


def test_unknown_demonstrators_and_ambiguous_tasks_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown demonstrator .oracle.; registered: solver, swe_demonstrator"):
        make_demonstrator("oracle", TOK, [])
    with pytest.raises(ValueError, match="share a problem statement"):
        make_demonstrator("swe_demonstrator", TOK, [task(), task(instance_id="b", patch=PATCH.replace("0", "9"))])


async def test_an_action_past_the_context_budget_ends_the_episode_truncated_not_infra() -> None:
    """The demonstrator is cut where a model would be (finish "length"), so the loop's one budget rule applies:
    the episode ends truncated at the context length (it was an infra error of the engine)."""
    engine = make_demonstrator("swe_demonstrator", TOK, [task()])
    prompt = "<issue>\n`test_f` fails in demo\n</issue>\n\nThe repository is checked out at /testbed."
    steps = [("1 failed", 0.0, False, False, {"role": "tool"})] * 4 + [("Submitted.", 1.0, True, False, {})]
    first = len(TOK.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True))
    budget = first + 400  # room for the first calls, not for all five
    traj = await run_episode(
        ScriptedEnv(steps, task=prompt), engine, TOK, AgentConfig(max_context_tokens=budget, max_action_tokens=200)
    )
    assert traj.status == "truncated" and traj.info["truncation_reason"] == "context_length", traj.info
    assert traj.num_tokens <= budget and traj.segments[-1].kind == "action"
