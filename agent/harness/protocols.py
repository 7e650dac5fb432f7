"""The harness seam: an agent of its own (mini-swe-agent, a user's script) plays one episode through SAO.

A harness is given three things and returns when its agent stops:

* a ``Workspace``: the task (its record and the env's first message) and ``run(command)``, which runs one shell
  command in the episode's sandbox through the env's own ``bash`` tool (same confinement, limits and "how your
  command ended" lines as SAO's own loop gets);
* an ``Endpoint``: an OpenAI-compatible base URL and model name (a gateway session in front of SAO's engine,
  which records the exact tokens; or a plain endpoint for evaluation, which records nothing);
* ``HarnessLimits``: the most model calls and seconds the agent may take.

``Harness.play`` returns a ``HarnessEnd`` (how the agent stopped: it submitted, or one of its limits, or its own
format-error exit). It never grades: SAO grades the repository (the env's ``aend``) after the agent stops, or the
env graded it already when its own limit ended the episode (``run`` then raises ``EpisodeEnded``: stop playing).

A harness that runs a blocking agent in a worker thread calls ``Workspace.run_sync`` from that thread.
docs/register_harness.md has a complete example.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

StopReason = Literal["submitted", "step_limit", "time_limit", "format_errors", "context_length", "error"]
"""How an agent stopped: it submitted (the episode terminates), or a limit or its format-error exit cut it (the
episode is truncated and graded on what exists), or it raised (``error``: an infra error unless the context
budget ended it)."""


def stop_reason(text: str) -> StopReason:
    """``text`` as a ``StopReason``; anything else is ``error``."""
    return text if text in get_args(StopReason) else "error"  # type: ignore[return-value]


class EpisodeEnded(Exception):
    """Raised by ``Workspace.run`` when the episode is over: the env's own limit ended it (and graded it), or the
    gateway's context budget is spent. ``reason`` is a ``StopReason``; the harness should stop its agent."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(message or f"the episode ended ({reason})")
        self.reason = reason


@dataclass(frozen=True)
class CommandResult:
    """One command's outcome as the model should see it: ``output`` (stdout and stderr, capped, with a line saying
    how it ended when it did not exit 0 normally) and ``exit_code`` (-1 when the env reported none)."""

    output: str
    exit_code: int


@dataclass(frozen=True)
class Endpoint:
    """Where the agent's model calls go: ``base_url`` (an OpenAI base URL ending in ``/v1``), the ``model`` name
    to send, the API key, and ``params``: request parameters to add to each call (empty for a gateway session,
    which samples with the run's own settings; temperature and max_tokens for a plain endpoint). ``recorded``:
    the calls go through a gateway session that records their tokens."""

    base_url: str
    model: str
    api_key: str = "sao"
    params: dict[str, Any] = field(default_factory=dict)
    recorded: bool = True


@dataclass(frozen=True)
class HarnessLimits:
    """``step_limit``: the most model calls of the agent (its own step limit); ``wall_s``: its wall-clock limit in
    seconds (0: none beyond the env's own ``max_wall_s``)."""

    step_limit: int
    wall_s: float = 0.0

    def __post_init__(self) -> None:
        if self.step_limit < 1:
            raise ValueError(f"HarnessLimits.step_limit must be >= 1, got {self.step_limit}")
        if self.wall_s < 0:
            raise ValueError(f"HarnessLimits.wall_s must be >= 0 seconds (0: none), got {self.wall_s}")


@dataclass(frozen=True)
class HarnessEnd:
    """How the agent stopped. ``reason``: a ``StopReason``; ``exit_status``: the agent's own word for it (e.g.
    mini-swe-agent's ``Submitted`` / ``LimitsExceeded``); ``messages``: the agent's conversation as it kept it (the
    only record of an unrecorded endpoint's episode); ``info``: anything else worth keeping (JSON-able)."""

    reason: StopReason
    exit_status: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def submitted(self) -> bool:
        return self.reason == "submitted"


class Workspace(Protocol):
    """The episode as a harness sees it (``sao.agent.harness.workspace.EnvWorkspace`` over a SAO env)."""

    task: Any
    """The task record (a SWE-bench instance for ``sao/SWE-v0``), or None when the env drew its own."""
    prompt: str
    """The env's first user message (its own wording of the task)."""

    @property
    def task_text(self) -> str:
        """The task in the words an outside agent expects: a SWE record's ``problem_statement``, else ``prompt``."""
        ...

    async def run(self, command: str) -> CommandResult:
        """Run one shell command in the episode's sandbox; ``EpisodeEnded`` once the episode is over."""
        ...

    def run_sync(self, command: str) -> CommandResult:
        """``run`` from a worker thread (a blocking agent); never from the event loop's own thread."""
        ...


class Harness(Protocol):
    """An agent that plays one episode (see the module doc)."""

    name: str

    def describe(self) -> dict[str, Any]:
        """Which agent and which of its configs run (JSON-able): recorded in eval reports and trajectories."""
        ...

    async def play(self, workspace: Workspace, endpoint: Endpoint, limits: HarnessLimits) -> HarnessEnd:
        """Play until the agent stops; an exception means the harness itself failed (an infra error)."""
        ...
