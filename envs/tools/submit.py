"""``submit``: ends the episode; the env grades the submission (its arguments, e.g. a final answer)."""

from __future__ import annotations

from typing import Any

from sao.envs.protocols import ToolResult
from sao.envs.tools._common import function_schema


class SubmitTool:
    """Ends the episode. With ``answer_field`` set (e.g. "answer"), the call must carry that string argument."""

    name = "submit"

    def __init__(self, description: str = "Submit your work and end the episode.", answer_field: str | None = None):
        self.description = description
        self.answer_field = answer_field

    @property
    def schema(self) -> dict[str, Any]:
        props: dict[str, Any] = {}
        required: list[str] = []
        if self.answer_field:
            props[self.answer_field] = {"type": "string", "description": "Your final answer."}
            required.append(self.answer_field)
        return function_schema(self.name, self.description, props, required)

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        if self.answer_field:
            value = arguments.get(self.answer_field)
            if value is None or (isinstance(value, str) and not value.strip()):
                return ToolResult(f"submit: missing required argument {self.answer_field!r}.", error=True)
        return ToolResult("Submitted.", done=True)
