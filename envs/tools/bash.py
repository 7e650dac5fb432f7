"""``bash``: runs a shell command in the sandbox (cwd the task's working directory), output capped, with a timeout."""

from __future__ import annotations

from typing import Any

from sao.envs.protocols import ToolResult
from sao.envs.tools._common import ArgError, command_output, function_schema, require
from sao.sandboxes.protocols import Sandbox


class BashTool:
    """Each call is a fresh ``bash -c`` (no shell state carries over except files); a ``SandboxError`` propagates
    (it is an infra error, not the model's fault)."""

    name = "bash"

    def __init__(self, sandbox: Sandbox, workdir: str | None = None, timeout: float = 120.0, max_output: int = 10_000):
        self.sandbox, self.workdir, self.timeout, self.max_output = sandbox, workdir, timeout, max_output

    @property
    def schema(self) -> dict[str, Any]:
        return function_schema(
            self.name,
            f"Run a bash command (timeout {self.timeout:g} s; output over {self.max_output} characters is cut). "
            "Shell state (cd, variables) does not persist between calls.",
            {"command": {"type": "string", "description": "The command to run."}},
            ["command"],
        )

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        try:
            command = require(arguments, "command", str, self.name)
        except ArgError as e:
            return ToolResult(str(e), error=True)
        if not command.strip():
            return ToolResult("bash: the command is empty.", error=True)
        res = await self.sandbox.exec(command, timeout=self.timeout, workdir=self.workdir)
        out = command_output(res, self.max_output, self.timeout)
        return ToolResult(out, exit_code=res.exit_code)
