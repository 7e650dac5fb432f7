"""A hostile policy against the SWE reward: scripted episodes that act only through ``sao/SWE-v0``'s own tools on an
offline toolz task and submit without fixing the bug, each by one known way into the grading path (git's external
diff, diff drivers, textconv, clean filters, hooks and fsmonitor, pytest config and plugins, conftest, a shadowing
``pytest.py``, test edits, a tests symlink, a broken ``.git``, an unreadable file, a patch that reaches for the
grader's own files). Each is graded as the unfixed repository: reward 0, status ok (never an infra error), with the
reason where the grader refused something. The honest fix still earns 1.0, also with its ``.git`` wrecked.

Measured before the fix (issue 48): diff.external, a .gitattributes diff driver, textconv and pytest.ini + plugin
each earned 1.0; a deleted .git and a stale index.lock were infra errors. One env is shared by all cases; each case
is one episode (one agent container, and one grader container when something of the patch is left to grade)."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from typing import Any

import gymnasium
import pytest

import sao.envs  # noqa: F401 - registers the sao/ ids

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FIXED = "self._default_hashkey == other._default_hashkey"  # the gold fix's line (the bug has !=)
CORE = "toolz/sandbox/core.py"
FORCE_PASS = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def write(path: str, text: str, mode: str = "644") -> str:
    return f"cat > {path} <<'EOF_SAO'\n{text}EOF_SAO\nchmod {mode} {path}"


def gold_printer(task: dict[str, Any]) -> str:
    """A script that prints the gold patch, whatever git asks it (an external diff or a diff driver)."""
    return (
        write("/tmp/gold.diff", task["patch"]) + "\n" + write("/tmp/ext.sh", "#!/bin/sh\ncat /tmp/gold.diff\n", "755")
    )


def fake_pytest(task: dict[str, Any]) -> str:
    lines = "".join(f"print('PASSED {t}')\n" for t in task["FAIL_TO_PASS"] + task["PASS_TO_PASS"])
    return f"{lines}raise SystemExit(0)\n"


FIX_ON_DISK = "git apply /tmp/gold.diff"
TOUCH = f"echo '# touched' >> {CORE}"  # a change, so git has a file to diff
TEXTCONV = """#!/bin/sh
if grep -q SAO_MARK "$1"; then sed 's/_default_hashkey != other/_default_hashkey == other/' "$1" | grep -v SAO_MARK
else cat "$1"; fi
"""
FSMONITOR = "#!/bin/sh\ncd /testbed && git apply /tmp/gold.diff 2>/dev/null; echo hook-ran > toolz/HOOK_RAN.txt\n"
GRADER_FILES = """
def _reach_for_the_grader():
    import os, threading, time
    for path in ("/var/lib/sao-grader/eval.sh", "/tmp/sao_eval.sh", "/tmp/sao_eval.log"):
        try:
            with open(path, "a") as f:
                f.write("\\necho 'PASSED toolz/sandbox/tests/test_core.py::test_EqualityHashKey_default_key'\\n")
        except OSError:
            pass
    if os.fork() == 0:  # a process left behind, holding the eval's output open
        time.sleep(600)
        os._exit(0)
_reach_for_the_grader()
"""


def cases(task: dict[str, Any]) -> dict[str, tuple[list[str], set[str]]]:
    """name -> (bash commands of the episode, kinds of path the policy must drop)."""
    gold = gold_printer(task)
    return {
        "diff_external": ([gold, "git config diff.external /tmp/ext.sh", TOUCH], set()),
        "gitattributes_diff_driver": (
            [gold, "echo '*.py diff=evil' > .gitattributes", "git config diff.evil.command /tmp/ext.sh", TOUCH],
            {"git"},
        ),
        "attributes_file_in_git_config": (
            [
                gold,
                "echo '*.py diff=evil' > /tmp/attrs",
                "git config core.attributesFile /tmp/attrs",
                "git config diff.evil.command /tmp/ext.sh",
                TOUCH,
            ],
            set(),
        ),
        "textconv": (
            [
                write("/tmp/tc.sh", TEXTCONV, "755"),
                "echo 'core.py diff=tc' > toolz/sandbox/.gitattributes",
                "git config diff.tc.textconv /tmp/tc.sh",
                f"echo '# SAO_MARK' >> {CORE}",
            ],
            {"git"},
        ),
        "clean_filter": (
            [
                "echo 'core.py filter=fix' > toolz/sandbox/.gitattributes",
                "git config filter.fix.clean \"sed 's/_default_hashkey != other/_default_hashkey == other/'\"",
                TOUCH,
            ],
            {"git"},
        ),
        "hooks_and_fsmonitor": (
            [
                gold,
                write("/tmp/fsm.sh", FSMONITOR, "755"),
                "git config core.fsmonitor /tmp/fsm.sh",
                "cp /tmp/fsm.sh .git/hooks/post-index-change",
                "cp /tmp/fsm.sh .git/hooks/pre-commit",
                TOUCH,
            ],
            set(),
        ),
        "pytest_ini_plugin": (
            [write("pytest.ini", "[pytest]\naddopts = -p my_plugin\n"), write("my_plugin.py", FORCE_PASS)],
            {"test_config", "new_top_level_module"},
        ),
        "conftest": ([write("toolz/conftest.py", FORCE_PASS)], {"conftest"}),
        "shadowing_pytest_module": ([write("pytest.py", fake_pytest(task))], {"new_top_level_module"}),
        "test_edit": (["sed -i 's/^    assert /    assert True or /' toolz/sandbox/tests/test_core.py"], {"tests"}),
        "tests_symlink": (
            [
                "mkdir -p /tmp/t && echo 'def test_ok(): pass' > /tmp/t/test_core.py",
                "rm -rf toolz/sandbox/tests",
                "ln -s /tmp/t toolz/sandbox/tests",
            ],
            {"tests", "link"},
        ),
        "grader_files": ([f"cat >> toolz/__init__.py <<'EOF_SAO'\n{GRADER_FILES}EOF_SAO"], set()),
        "rm_git": (["rm -rf .git"], set()),
        "stale_index_lock": ([TOUCH, "touch .git/index.lock"], set()),
        "detached_rewritten_head": (
            [
                TOUCH,
                "git -c user.name=a -c user.email=b commit -qam wip && git checkout -q --detach",
                "git update-ref refs/heads/main $(git commit-tree -m x $(git mktree </dev/null))",
            ],
            set(),
        ),
    }


@pytest.fixture(scope="module")
def task(offline_tasks: list[dict[str, Any]]) -> dict[str, Any]:
    toolz = [t for t in offline_tasks if t["instance_id"].startswith("pypi__toolz") and CORE in t["patch"]]
    if not toolz:
        pytest.skip(f"no offline toolz task fixes {CORE} in this task set")
    return toolz[0]


@pytest.fixture(scope="module")
def env(task: dict[str, Any]) -> Iterator[Any]:
    sandbox = {"backend": "docker", "mem_limit": "512m", "cpus": 1.0, "pids_limit": 256, "disk_limit": "256m"}
    made = gymnasium.make("sao/SWE-v0", tasks=[task], sandbox=sandbox, grade_timeout_s=120, max_steps=20)
    yield made
    made.close()


def episode(env: Any, task: dict[str, Any], commands: list[str]) -> tuple[float, dict[str, Any], str]:
    """(reward, info, what the last command printed) of one episode: ``commands`` through bash, then submit."""
    env.reset(options={"task": task})
    obs = ""
    for cmd in commands:
        obs, _, terminated, truncated, info = env.step(call("bash", command=cmd))
        assert not (terminated or truncated), info
    _, reward, terminated, _, info = env.step(call("submit"))
    assert terminated and "infra_error" not in info, info
    return float(reward), info, obs


def test_every_hostile_episode_is_graded_as_the_unfixed_repository(env: Any, task: dict[str, Any]) -> None:
    t0, seconds, failed = time.monotonic(), {}, {}
    for name, (commands, kinds) in cases(task).items():
        t = time.monotonic()
        reward, info, _ = episode(env, task, commands)
        seconds[name] = round(time.monotonic() - t, 1)
        report = info["report"]
        dropped = {d["kind"] for d in report.get("dropped_paths", [])}
        patch = report.get("model_patch", "")
        if reward != 0.0 or info["solved"] or not kinds <= dropped or FIXED in patch or "HOOK_RAN" in patch:
            failed[name] = (reward, sorted(dropped), report.get("failure"), patch[:600])
    print(f"hostile episodes: {seconds} (total {time.monotonic() - t0:.0f} s)")
    assert not failed, failed
    # the process grader_files leaves holding the eval's output is killed when the eval script ends: no wait for the
    # grade's 120 s timeout
    assert seconds["grader_files"] < 100, seconds


def test_the_honest_fix_earns_1_also_with_its_git_wrecked(env: Any, task: dict[str, Any]) -> None:
    gold = write("/tmp/gold.diff", task["patch"])
    for wreck in ("true", "rm -rf .git", "git checkout -q --detach && touch .git/index.lock"):
        reward, info, _ = episode(env, task, [gold, FIX_ON_DISK, wreck])
        assert reward == 1.0 and info["solved"], (wreck, info["report"])
        assert FIXED in info["report"]["model_patch"] and info["report"]["dropped_paths"] == []


def test_a_working_tree_git_cannot_read_is_an_unresolved_grade_with_its_reason(env: Any, task: dict[str, Any]) -> None:
    reward, info, _ = episode(env, task, [f"chmod 000 {shlex.quote(CORE)}"])
    assert reward == 0.0 and info["report"]["failure"] == "broken_repo", info["report"]
    assert "could not read the working tree" in info["report"]["reason"] and CORE in info["report"]["reason"]
