"""The bash-only demonstrator: its steps from a gold patch, and a whole episode of it played by the real
mini-swe-agent package through the gateway in a git repository on this machine (its commands really run)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from agent_fakes import CharChatMLTokenizer
from harness_fakes import FIXED, TASK, ShellEnv

from sao.agent.engines.mini_swe_demonstrator import demonstration, edit_command, next_step, returncode
from sao.agent.engines.protocols import EngineError
from sao.agent.engines.registry import make_demonstrator, parse_model_spec
from sao.agent.episodes import Episode, EpisodeRunner, RunnerConfig
from sao.agent.harness.registry import PlayerArgs, make_player
from sao.agent.loop import AgentConfig


def test_the_shell_edit_replaces_once_or_refuses(tmp_path: Path) -> None:
    f = tmp_path / "calc.py"
    f.write_text("x = 'a'\ny = \"b\\n\"\n" + "    return a - b\n")
    ok = subprocess.run(["bash", "-c", edit_command("calc.py", "return a - b", "return a + b")], cwd=tmp_path,
                        capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0 and f.read_text().endswith("    return a + b\n")
    quoted = subprocess.run(["bash", "-c", edit_command("calc.py", "y = \"b\\n\"", "y = 'c $HOME `x`'")],
                            cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert quoted.returncode == 0 and "y = 'c $HOME `x`'\n" in f.read_text()  # no shell expansion in the heredoc
    refused = subprocess.run(["bash", "-c", edit_command("calc.py", "nowhere", "x")], cwd=tmp_path,
                             capture_output=True, text=True)  # fmt: skip
    assert refused.returncode == 1 and "occurs 0 times" in refused.stderr


def test_the_steps_follow_the_observations() -> None:
    steps = demonstration(TASK)
    thought, cmd = next(steps)
    assert cmd == "python -m pytest -q --tb=short test_calc.py::test_add" and thought
    grep = steps.send("<returncode>1</returncode>\n<output>\nE assert -1 == 5\n</output>")
    assert grep[1] == "grep -rn --include='*.py' 'def add(' *"  # the issue names add(): no test source first
    view = steps.send("<returncode>0</returncode>\n<output>\ncalc.py:1:def add(a, b):\n</output>")
    assert view[1] == "nl -ba calc.py | sed -n '1,2p'"
    edit = steps.send("<returncode>0</returncode>\n<output>\n1 def add...\n</output>")
    assert "old = 'return a - b'" in edit[1]
    retry = steps.send("<returncode>1</returncode>\n<output>\nAssertionError\n</output>")  # refused: a longer form
    assert "old = 'def add(a, b):\\n    return a - b'" in retry[1]
    rest = [steps.send("<returncode>0</returncode>")[1] for _ in range(4)]
    assert rest[1:] == ["git diff -- calc.py > patch.txt", "cat patch.txt",
                        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt"]  # fmt: skip
    with pytest.raises(EngineError, match="went on after its submit"):
        next_step(TASK, ["<returncode>0</returncode>"] * 12)
    assert returncode("<returncode>-1</returncode>") == -1 and returncode("no code") is None


def test_it_is_reachable_as_a_model_spec_and_needs_its_tasks() -> None:
    assert parse_model_spec("mini_swe_demonstrator").kind == "mini_swe_demonstrator"
    assert parse_model_spec("swe_demonstrator").kind == "swe_demonstrator"  # every demonstrator: sao collect --model
    with pytest.raises(ValueError, match="no tasks given"):
        make_demonstrator("mini_swe_demonstrator", CharChatMLTokenizer(), [])


async def test_a_whole_demonstration_through_mini_swe_agent_fixes_the_repository(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    from sao.agent.harness.mini_swe_agent import prepare_import

    prepare_import()  # before the package is first imported: quiet, its config dir in our cache
    pytest.importorskip("minisweagent", reason="mini-swe-agent comes with the agents extra")
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(str(smollm2_dir))
    engine = make_demonstrator("mini_swe_demonstrator", tok, [TASK])
    player = make_player("mini-swe-agent", PlayerArgs(AgentConfig(8192, 512, max_turns=20), engine, tok))
    env = ShellEnv(tmp_path / "repo")
    async with EpisodeRunner(lambda: env, player, RunnerConfig(1, progress=False)) as runner:
        (row,) = await runner.run_one(Episode(0, TASK, 0, TASK["instance_id"]))
    assert (tmp_path / "repo" / "calc.py").read_text() == FIXED
    assert row.status == "ok" and row.reward == 1.0 and row.info["prefix_breaks"] == 0
    submission = row.info["submission"]
    assert row.info["exit_status"] == "Submitted" and submission.startswith("diff --git a/calc.py b/calc.py")
    assert "-    return a - b\n+    return a + b" in submission
    assert [c.split("\n")[1].split()[0] for c in env.commands] == [
        "python", "grep", "nl", "python", "python", "git", "cat", "echo",
    ]  # fmt: skip
