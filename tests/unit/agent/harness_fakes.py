"""A SWE-like env without Docker for harness tests: a git repository in a temp folder, a ``bash`` tool that runs
commands there with the host's bash, and ``aend`` grading whether the repository holds the fix."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sao.envs.protocols import FormatError
from sao.envs.tools.parsing import parse_action

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
PATCH = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""
TASK = {
    "instance_id": "demo__calc-1",
    "problem_statement": "`add(2, 3)` returns -1 instead of 5.\n`test_calc.py::test_add` fails.",
    "patch": PATCH,
    "FAIL_TO_PASS": ["test_calc.py::test_add"],
    "sao_mutation": {"function": "calc.add"},
}


class ShellEnv:
    """``bash`` tool calls run in ``root`` (a git repository with the bug); ``max_steps`` ends the episode as the
    SWE env does (graded there); ``aend`` grades: reward 1.0 when ``calc.py`` holds the fix."""

    def __init__(self, root: Path, max_steps: int = 20) -> None:
        self.root, self.max_steps = root, max_steps
        self.commands: list[str] = []
        self.ended: list[str] = []
        self.closed = False
        root.mkdir(parents=True, exist_ok=True)
        (root / "calc.py").write_text(BUGGY)
        (root / "test_calc.py").write_text(TEST)
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
        for cmd in (["git", "init", "-q"], ["git", "add", "-A"], [*git, "commit", "-qm", "base"]):
            subprocess.run(cmd, cwd=root, check=True, capture_output=True)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        return "Fix calc.add.", {"role": "user", "system_prompt": "", "tools": [], "task_id": TASK["instance_id"]}

    def _grade(self) -> tuple[float, dict[str, Any]]:
        solved = (self.root / "calc.py").read_text() == FIXED
        return float(solved), {"graded": True, "solved": solved, "report": {"resolved": solved}}

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        try:
            call = parse_action(action)
        except FormatError as e:
            return str(e), 0.0, False, False, {"role": "user", "format_error": True}
        if call.name != "bash":
            return f"Unknown tool {call.name!r}.", 0.0, False, False, {"role": "user", "format_error": True}
        command = str(call.arguments["command"])
        self.commands.append(command)
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", command, cwd=self.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        out = (await proc.communicate())[0].decode(errors="replace")
        info: dict[str, Any] = {"role": "tool", "exit_code": proc.returncode, "format_error": False}
        if len(self.commands) >= self.max_steps:
            reward, graded = self._grade()
            return out, reward, False, True, {**info, **graded, "truncation_reason": "step_limit"}
        return out or "[no output]", 0.0, False, False, info

    async def aend(self, reason: str) -> tuple[float, dict[str, Any]]:
        self.ended.append(reason)
        return self._grade()

    async def aclose(self) -> None:
        self.closed = True
