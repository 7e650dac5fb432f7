"""The env seams: tools the model can call, the parsed action, and the keys envs put in ``info``.

Conventions every SAO env follows (the agent relies on them):
- An action is the model's raw assistant text. The env parses it with ``sao.envs.tools.parsing.parse_action``:
  a ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block (what function-calling chat templates
  emit), or a fenced code block (```bash / ```python) for envs that accept one. Text envs may take the text as-is.
- An observation is the text of the next message the model will see; ``info["role"]`` says which chat role
  carries it ("tool" for tool results, "user" otherwise). ``reset`` returns the task statement as a "user" message
  and ``info["system_prompt"]`` and ``info["tools"]`` (JSON schemas) for the first render.
- ``info`` is typed: ``ResetInfo`` for ``reset`` and ``StepInfo`` for ``step`` (``TypedDict``s, so Gymnasium
  still sees a dict). An env may add keys of its own (e.g. ``turn_correct``); the agent reads only the typed ones.
  ``infra_error`` (str) means the infrastructure failed: the episode ends with ``truncated=True`` and the agent
  marks the trajectory infra_error. The reward of each step is the step's return value; the agent records it on
  the action segment that earned it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypedDict, runtime_checkable

TruncationReason = Literal["step_limit", "time_limit", "format_errors", "context_length", "max_turns"]


class ResetInfo(TypedDict, total=False):
    """What ``reset`` tells the agent for the first render."""

    role: str  #: chat role of the first observation ("user")
    system_prompt: str
    tools: list[dict[str, Any]]  #: OpenAI-style function schemas
    task_id: str
    level: int  #: the task's difficulty level, for tasks that have one (``arithmetic_chain``)


class StepInfo(TypedDict, total=False):
    """The env -> agent record of one step (every key optional; absent means "not applicable").

    ``role``: chat role that carries the observation ("tool" for tool results, else "user"). ``format_error``: the
    action could not be parsed. ``infra_error``: the infrastructure failed (the episode ends, never trained on).
    ``truncation_reason``: which limit ended the episode. ``solved`` and ``report``: the grade, at the end.
    ``graded``: set when a limit ends the episode (``truncated``): whether the env graded what exists there (its
    return is then complete and the trainer treats the cut as terminal); False: reward may still be to come, so the
    trainer bootstraps from V after the last action.
    ``tool_name``, ``exit_code``, ``tool_error``, ``timings`` (seconds), ``step`` (1-based): what the turn did.
    """

    role: str
    format_error: bool
    infra_error: str
    truncation_reason: TruncationReason
    solved: bool
    report: dict[str, Any]
    graded: bool
    tool_name: str
    exit_code: int | None
    tool_error: bool
    timings: dict[str, float]
    step: int


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
