"""The shared core of every SAO text env: Gymnasium API over async episodes, limits, infra errors, info keys.

Two layers, both meant to be subclassed in a few lines:

``MultiTurnEnv`` (any text env) owns the Gymnasium plumbing. A subclass implements three hooks:
- ``sample_task(rng)`` draws a task when ``reset`` gets no ``options={"task": ...}`` (optional);
- ``async start_episode(task) -> (first user message, extra reset info)``;
- ``async take_turn(action) -> Turn`` (what one assistant message did);
and optionally ``async end_episode()`` (release per-episode resources; called when an episode ends, on the next
reset and on close), ``async on_truncation(reason) -> Grade | None`` (grade what exists when a limit ends the
episode, e.g. the SWE env diffs the repo on the step limit; also called by ``aend`` when the agent's own context
or turn cap ends it), ``system_prompt()`` and ``tool_schemas()``. ``info`` is typed: ``sao.envs.protocols.ResetInfo``
and ``StepInfo``.

``ToolEnv`` (a tool-calling env) implements ``take_turn``: it parses the action with
``sao.envs.tools.parsing.parse_action``, runs the named tool, and on ``submit`` calls ``grade``. Its hooks:
- ``async setup(task)``: make the sandbox and whatever the episode needs;
- ``tools() -> list[Tool]``: the episode's tools (called after ``setup``);
- ``task_prompt(task) -> str`` and ``system_prompt() -> str``;
- ``async grade(submission: dict) -> Grade``: ``submission`` is the submit tool's arguments;
- ``async on_text(text) -> dict | None``: a plain-text turn with no tool call; return a submission to end the
  episode with it (e.g. a final ``\\boxed{}`` answer) or ``None`` for a format error (the default);
- ``async teardown()``: close the sandbox.

Limits (all end the episode with ``truncated=True`` and ``info["truncation_reason"]``): ``max_steps``
("step_limit"), ``max_wall_s`` measured from reset ("time_limit"; a turn still running at the deadline is
cancelled), ``max_format_errors`` consecutive unparseable actions ("format_errors"). ``info["graded"]`` says
whether ``on_truncation`` graded the cut: a graded cut's return is complete (terminal for the trainer's GAE), an
ungraded one bootstraps from V; a "format_errors" ending, caused by the policy, is terminal either way.

Infra errors: a ``sao.sandboxes.protocols.SandboxError`` raised by a hook during a step ends the episode with
``truncated=True``, reward 0 and ``info["infra_error"]`` (the agent marks the trajectory infra_error; it is never
trained on). During ``reset`` it propagates: there is no episode to mark. A bad task record raises ``ValueError``.
The policy's failures are scored, never dropped: a ``sao.sandboxes.protocols.SandboxDiedError`` (the sandbox died
during the agent's own command, its backend healthy) ends the episode with ``terminated=True``, reward 0, not
solved, and ``info["report"] == {"failure": "sandbox_died", "reason": ...}``; the agent keeps it for training.

Sync and async: ``areset``/``astep``/``aclose`` are the real methods (the episode loop awaits them); ``reset``/
``step``/``close`` run them on a private event loop owned by the env. Use one style per env instance: resources
made on one loop (subprocesses, sandboxes) belong to it. Calling the sync methods inside a running loop raises.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import gymnasium as gym
import numpy as np

from sao.envs.protocols import FormatError, ResetInfo, StepInfo, Tool, ToolCall, TruncationReason
from sao.envs.spaces import UnicodeText
from sao.sandboxes.protocols import SandboxDiedError, SandboxError

T = TypeVar("T")

DEFAULT_MAX_TEXT = 1 << 20


@dataclass
class Turn:
    """What one assistant message did, before the base class applies the limits.

    ``info`` is merged into the step's info (e.g. ``tool_name``, ``exit_code``, ``report``, ``solved``).
    """

    observation: str
    reward: float = 0.0
    terminated: bool = False
    role: str = "user"
    format_error: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Grade:
    """A graded episode: the reward, whether it counts as solved, and the grading details (``info["report"]``)."""

    reward: float
    solved: bool
    report: dict[str, Any] = field(default_factory=dict)


def died_grade(e: SandboxDiedError) -> Grade:
    """The grade of an episode whose sandbox died during the agent's command: a failure, with its reason."""
    return Grade(reward=0.0, solved=False, report={"failure": "sandbox_died", "reason": str(e)})


def cap_text(text: str, limit: int, marker: str = "\n[... {n} characters cut ...]\n") -> str:
    """Keep the head and tail of ``text`` around a marker when it is longer than ``limit`` characters."""
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    head = limit // 2
    return text[:head] + marker.format(n=cut) + text[len(text) - (limit - head) :]


class MultiTurnEnv(gym.Env[str, str]):
    """A multi-turn text env: actions are assistant messages, observations the next message (see module doc)."""

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's class attribute convention

    def __init__(
        self,
        *,
        max_steps: int = 30,
        max_wall_s: float = 1800.0,
        max_format_errors: int = 3,
        max_obs_chars: int = 16_000,
        max_action_chars: int = DEFAULT_MAX_TEXT,
    ) -> None:
        for name, value in (("max_steps", max_steps), ("max_format_errors", max_format_errors)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if max_wall_s <= 0:
            raise ValueError(f"max_wall_s must be > 0 seconds, got {max_wall_s}")
        self.max_steps = int(max_steps)
        self.max_wall_s = float(max_wall_s)
        self.max_format_errors = int(max_format_errors)
        self.max_obs_chars = int(max_obs_chars)
        # The cap marker adds a few dozen characters; the space admits them.
        self.observation_space = UnicodeText(max_length=self.max_obs_chars + 64)
        self.action_space = UnicodeText(max_length=max_action_chars)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._active = False
        self._steps = 0
        self._format_errors = 0
        self._t0 = 0.0

    # ---- hooks --------------------------------------------------------------------------------------------
    def sample_task(self, rng: np.random.Generator) -> Any:
        """Draw a task for ``reset`` without ``options["task"]``; ``rng`` is the env's seeded generator."""
        raise ValueError(f"{type(self).__name__} has no dataset: pass the task as reset(options={{'task': ...}})")

    async def start_episode(self, task: Any) -> tuple[str, dict[str, Any]]:
        """Begin an episode on ``task``: return the first user message and extra reset-info keys."""
        raise NotImplementedError

    async def take_turn(self, action: str) -> Turn:
        """Apply one assistant message."""
        raise NotImplementedError

    async def end_episode(self) -> None:
        """Release per-episode resources. Called once per episode (episode end, next reset, or close)."""

    async def on_truncation(self, reason: str) -> Grade | None:
        """Grade what exists when a limit ends the episode. A ``Grade`` completes the episode's return (the trainer
        treats the cut as terminal); ``None`` means nothing was graded: reward may still be to come, so the trainer
        bootstraps from V after the last action (``info["graded"]`` records which)."""
        return None

    def system_prompt(self) -> str:
        return ""

    def tool_schemas(self) -> list[dict[str, Any]]:
        return []

    # ---- async API ----------------------------------------------------------------------------------------
    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, ResetInfo]:
        """Start an episode on ``options["task"]`` or on a task drawn with the (re)seeded generator."""
        gym.Env.reset(self, seed=seed)
        await self._finish()
        options = options or {}
        task = options["task"] if options.get("task") is not None else self.sample_task(self.np_random)
        self._steps = 0
        self._format_errors = 0
        self._t0 = time.monotonic()
        obs, extra = await self.start_episode(task)
        self._active = True
        info = ResetInfo(role="user", system_prompt=self.system_prompt(), tools=copy.deepcopy(self.tool_schemas()))
        info.update(cast(ResetInfo, extra))
        return cap_text(obs, self.max_obs_chars), info

    async def astep(self, action: str) -> tuple[str, float, bool, bool, StepInfo]:
        """One assistant message -> (observation, reward, terminated, truncated, info)."""
        if not self._active:
            raise RuntimeError(f"{type(self).__name__}.step called with no running episode: call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"actions are the assistant's text (str), got {type(action).__name__}")
        self._steps += 1
        remaining = self.max_wall_s - (time.monotonic() - self._t0)
        reason: TruncationReason | None = None
        try:
            if remaining <= 0:
                raise TimeoutError
            turn = await asyncio.wait_for(self.take_turn(action), timeout=remaining)
        except TimeoutError:
            turn = Turn(observation=f"Time limit of {self.max_wall_s:g} s reached.")
            reason = "time_limit"
        except SandboxError as e:
            await self._finish()
            failed = StepInfo(role="user", infra_error=f"{type(e).__name__}: {e}", format_error=False, solved=False)
            return "", 0.0, False, True, failed
        except SandboxDiedError as e:
            return await self._sandbox_died(e)
        info = StepInfo(role=turn.role, format_error=turn.format_error, step=self._steps)
        info.update(cast(StepInfo, turn.info))
        self._format_errors = self._format_errors + 1 if turn.format_error else 0
        reward, terminated = float(turn.reward), bool(turn.terminated)
        if not terminated and reason is None:
            if self._format_errors >= self.max_format_errors:
                reason = "format_errors"
            elif self._steps >= self.max_steps:
                reason = "step_limit"
            elif time.monotonic() - self._t0 >= self.max_wall_s:
                reason = "time_limit"
        truncated = reason is not None
        if reason is not None:
            info["truncation_reason"] = reason
            try:
                grade = await self.on_truncation(reason)
            except SandboxError as e:
                await self._finish()
                info["infra_error"] = f"{type(e).__name__}: {e}"
                return cap_text(turn.observation, self.max_obs_chars), 0.0, False, True, info
            except SandboxDiedError as e:
                grade = died_grade(e)
            info["graded"] = grade is not None
            if grade is not None:
                reward += grade.reward
                info["report"], info["solved"] = grade.report, grade.solved
            info.setdefault("solved", False)
        if terminated or truncated:
            await self._finish()
        return cap_text(turn.observation, self.max_obs_chars), reward, terminated, truncated, info

    async def aend(self, reason: str) -> tuple[float, StepInfo]:
        """The agent ended a running episode (its context or turn cap): grade what exists, as a limit would.

        Returns the grade's reward and info (``{}`` and 0.0 when no episode runs). A ``SandboxError`` while
        grading is reported as ``info["infra_error"]``."""
        if not self._active:
            return 0.0, StepInfo()
        info = StepInfo()
        reward = 0.0
        try:
            grade = await self.on_truncation(reason)
            info["graded"] = grade is not None
            if grade is not None:
                reward = float(grade.reward)
                info["report"], info["solved"] = grade.report, grade.solved
        except SandboxError as e:
            info["infra_error"] = f"{type(e).__name__}: {e}"
        except SandboxDiedError as e:
            info["report"], info["solved"], info["graded"] = died_grade(e).report, False, True
        finally:
            await self._finish()
        return reward, info

    async def _sandbox_died(self, e: SandboxDiedError) -> tuple[str, float, bool, bool, StepInfo]:
        """The agent's command took its sandbox down: a scored failure that ends the episode."""
        await self._finish()
        grade = died_grade(e)
        info = StepInfo(role="user", format_error=False, step=self._steps, report=grade.report, solved=False)
        return f"The sandbox died during your command; the episode ends. ({e})", 0.0, True, False, info

    async def aclose(self) -> None:
        await self._finish()

    async def _finish(self) -> None:
        if self._active:
            self._active = False
            await self.end_episode()

    # ---- sync API (Gymnasium) -----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = self._run(self.areset(seed=seed, options=options))
        return obs, dict(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self._run(self.astep(action))
        return obs, reward, terminated, truncated, dict(info)

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.run_until_complete(self.aclose())
            self._loop.close()
        elif self._active:
            self._run(self.aclose())
            if self._loop is not None:
                self._loop.close()
        self._loop = None

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._loop is None or self._loop.is_closed():
                self._loop = asyncio.new_event_loop()
            return self._loop.run_until_complete(coro)
        coro.close()
        raise RuntimeError(
            f"{type(self).__name__}: sync reset/step/close called inside a running event loop; "
            "await areset()/astep()/aclose() instead"
        )


class ToolEnv(MultiTurnEnv):
    """A tool-calling env: parse the action, run the tool, grade on ``submit`` (hooks in the module doc)."""

    #: fenced code blocks accepted as tool calls, e.g. ``{"python": ("python", "code")}``.
    fenced: dict[str, tuple[str, str]] = {}  # noqa: RUF012 - per-class default, subclasses override

    def __init__(self, **limits: Any) -> None:
        super().__init__(**limits)
        self._tools: dict[str, Tool] = {}

    # ---- hooks --------------------------------------------------------------------------------------------
    async def setup(self, task: Any) -> None:
        """Prepare the episode (make the sandbox). ``task`` is what ``parse_task`` returned."""

    def parse_task(self, task: Any) -> Any:
        """Validate a task record; raise ``ValueError`` naming the missing or bad field."""
        return task

    def tools(self) -> list[Tool]:
        raise NotImplementedError

    def task_prompt(self, task: Any) -> str:
        raise NotImplementedError

    async def grade(self, submission: dict[str, Any]) -> Grade:
        raise NotImplementedError

    async def on_text(self, text: str) -> dict[str, Any] | None:
        return None

    async def teardown(self) -> None:
        """Release what ``setup`` made."""

    def task_info(self, task: Any) -> dict[str, Any]:
        """Extra reset-info keys for this task (e.g. ``task_id``)."""
        if isinstance(task, dict) and "id" in task:
            return {"task_id": str(task["id"])}
        return {}

    # ---- MultiTurnEnv hooks -------------------------------------------------------------------------------
    def tool_schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self._tools.values()]

    async def start_episode(self, task: Any) -> tuple[str, dict[str, Any]]:
        task = self.parse_task(task)
        try:
            await self.setup(task)
            self._tools = {t.name: t for t in self.tools()}
        except BaseException:
            await self.teardown()
            raise
        return self.task_prompt(task), self.task_info(task)

    async def end_episode(self) -> None:
        await self.teardown()

    async def take_turn(self, action: str) -> Turn:
        from sao.envs.tools.parsing import parse_action

        try:
            call = parse_action(action, fenced=self.fenced)
        except FormatError as e:
            submission = await self.on_text(action)
            if submission is not None:
                return await self._submit(submission)
            return Turn(observation=str(e), format_error=True)
        return await self._call(call)

    async def _call(self, call: ToolCall) -> Turn:
        tool = self._tools.get(call.name)
        if tool is None:
            names = ", ".join(sorted(self._tools)) or "(none)"
            return Turn(observation=f"Unknown tool {call.name!r}. Available tools: {names}.", format_error=True)
        t0 = time.monotonic()
        result = await tool(dict(call.arguments))
        timings = {"tool_s": time.monotonic() - t0}
        if result.done and not result.error:
            turn = await self._submit(dict(call.arguments))
            turn.info["tool_name"] = call.name
            return turn
        info = {"tool_name": call.name, "exit_code": result.exit_code, "timings": timings, "tool_error": result.error}
        return Turn(observation=result.output, role="tool", info=info)

    async def _submit(self, submission: dict[str, Any]) -> Turn:
        grade = await self.grade(submission)
        info = {"report": grade.report, "solved": grade.solved}
        return Turn(observation="Submitted.", reward=grade.reward, terminated=True, info=info)
