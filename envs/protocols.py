"""The env seams: tools the model can call, the parsed action, and the keys envs put in ``info``.

Conventions every SAO env follows (the agent relies on them):
- An action is the model's raw assistant text. The env parses it with ``envs.tools.parsing.parse_action``:
  a ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block (what function-calling chat templates
  emit), or a fenced code block (```bash / ```python) for envs that accept one. Text envs may take the text as-is.
- An observation is the text of the next message the model will see; ``info["role"]`` says which chat role
  carries it ("tool" for tool results, "user" otherwise). ``reset`` returns the task statement as a "user" message
  and ``info["system_prompt"]`` and ``info["tools"]`` (JSON schemas) for the first render.
- ``info`` keys: ``role``, ``tool_name``, ``exit_code``, ``timings`` (seconds), ``infra_error`` (str, when the
  infrastructure failed; the episode then ends with ``truncated=True`` and the agent marks it infra_error),
  ``format_error`` (bool), ``truncation_reason`` ("step_limit" | "time_limit" | "format_errors"), and at the end
  ``report`` (grading details) and ``solved`` (bool).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


class FormatError(ValueError):
    """The action could not be parsed into a tool call; the message tells the model the expected format."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolResult:
    """What a tool returns: the text for the model, the exit code when there is one, and whether it ends the
    episode (``submit``)."""

    output: str
    exit_code: int | None = None
    done: bool = False
    error: bool = False


@runtime_checkable
class Tool(Protocol):
    """A callable the model can use. ``schema`` is an OpenAI-style function schema
    ``{"type": "function", "function": {"name", "description", "parameters"}}``."""

    name: str

    @property
    def schema(self) -> dict[str, Any]: ...

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult: ...
