"""How a command ended, as the tools tell the model; the editor's refused writes; a dying sandbox is scored."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import ClassVar

import pytest
from envs_local_sandbox import LocalSandbox

from sao.envs.base import Grade, ToolEnv
from sao.envs.protocols import Tool
from sao.envs.tools import BashTool, EditorTool, PythonTool
from sao.envs.tools._common import command_output, how_it_ended
from sao.sandboxes.protocols import ExecResult, SandboxDiedError


@pytest.mark.parametrize(
    ("res", "expected"),
    [
        (ExecResult(0, "ok\n"), ""),
        (ExecResult(3, ""), "[exit code 3]"),
        (ExecResult(124, "", timed_out=True), "[the command timed out after 10 s and was killed]"),
        (ExecResult(137, "Killed\n", oom_killed=True), "[killed for memory (exit code 137)"),
        (ExecResult(137, ""), "[exit code 137: killed by SIGKILL]"),
        (ExecResult(153, ""), "[exit code 153: killed by SIGXFSZ]"),
        (ExecResult(137, "", disk_full=True), "[killed: the files written in the sandbox passed its disk limit"),
        (ExecResult(1, "OSError: [Errno 28] No space left on device\n"), "[a write was refused"),
    ],
)
def test_how_it_ended(res: ExecResult, expected: str) -> None:
    text = how_it_ended(res, 10)
    assert expected in text if expected else text == ""


def test_command_output_appends_the_ending_and_marks_silence() -> None:
    assert command_output(ExecResult(0, ""), 100, 5) == "[no output]"
    assert command_output(ExecResult(137, "", oom_killed=True), 100, 5).startswith("[killed for memory")
    assert command_output(ExecResult(2, "err\n"), 100, 5) == "err\n[exit code 2]"
    assert command_output(ExecResult(1, "Traceback\n"), 100, 5, explained_exit=1) == "Traceback\n"


class EndingSandbox(LocalSandbox):
    """Every command "ends" with the given result; writes refused with the given error."""

    def __init__(self, root: Path, result: ExecResult | None = None, write_error: OSError | None = None) -> None:
        super().__init__(root)
        self.result, self.write_error = result, write_error

    async def exec(
        self, cmd: str, timeout: float = 60.0, workdir: str | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        return self.result if self.result is not None else await super().exec(cmd, timeout, workdir, env)

    async def write_file(self, path: str, content: str) -> None:
        if self.write_error is not None:
            raise self.write_error
        await super().write_file(path, content)


async def test_bash_and_python_tell_a_memory_kill(tmp_path: Path) -> None:
    sb = EndingSandbox(tmp_path, ExecResult(137, "", oom_killed=True))
    for tool in (BashTool(sb), PythonTool(sb)):
        r = await tool({"command": "x", "code": "x"})
        assert r.output.startswith("[killed for memory (exit code 137)") and r.exit_code == 137


async def test_editor_reports_refused_writes_and_failed_helpers(tmp_path: Path) -> None:
    full = OSError(errno.EFBIG, "/w/a.py: over the sandbox's disk limit (sandbox.disk_limit)")
    ed = EditorTool(EndingSandbox(tmp_path, write_error=full), workdir=str(tmp_path))
    r = await ed({"command": "create", "path": "a.py", "file_text": "x = 1\n"})
    assert r.error and "disk limit" in r.output
    ed = EditorTool(EndingSandbox(tmp_path, ExecResult(137, "", oom_killed=True)), workdir=str(tmp_path))
    r = await ed({"command": "view", "path": str(tmp_path)})
    assert r.error and "killed for memory" in r.output


class DyingEnv(ToolEnv):
    """A tool whose command takes the sandbox down."""

    def tools(self) -> list[Tool]:
        class Boom:
            name = "boom"
            schema: ClassVar[dict[str, object]] = {"type": "function", "function": {"name": "boom"}}

            async def __call__(self, arguments: dict[str, object]) -> object:
                raise SandboxDiedError("the sandbox died during the agent's command (test)")

        return [Boom()]  # type: ignore[list-item]

    def task_prompt(self, task: object) -> str:
        return "go"

    async def grade(self, submission: dict[str, object]) -> Grade:
        return Grade(1.0, True)


def test_a_dying_sandbox_is_a_scored_failure_not_an_infra_error() -> None:
    env = DyingEnv()
    env.reset(options={"task": {"id": "t"}})
    obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": "boom", "arguments": {}}</tool_call>')
    assert (reward, terminated, truncated, info["solved"]) == (0.0, True, False, False)
    assert "infra_error" not in info and info["report"]["failure"] == "sandbox_died"
    assert "sandbox died during your command" in obs
    env.close()
