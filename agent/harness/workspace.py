"""``EnvWorkspace``: a harness's commands run as ``bash`` tool calls of the episode's own SAO env.

Each ``run(command)`` is one ``env.astep`` of a ``<tool_call>`` to the env's ``bash`` tool, so a harness gets
exactly what SAO's own loop gets from ``sao/SWE-v0``: the same sandbox (its confinement, the warm pool it came
from, its disk / memory / time limits), the same output caps and the same lines saying how a command ended; and
the env's own limits (``max_steps``, ``max_wall_s``) count the harness's commands. When a step ends the episode
(a limit: the env graded the repository there; the sandbox died; an infra error) ``run`` raises
``EpisodeEnded`` and the workspace keeps the outcome (``ended``, ``reward``, ``info``) for the player.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from sao.agent.harness.protocols import CommandResult, EpisodeEnded

BASH_TOOL = "bash"


def bash_call(command: str, tool: str = BASH_TOOL) -> str:
    """The assistant text of one call of the env's bash tool (what ``sao.envs.tools.parsing`` reads). ``</`` is
    written ``<\\/`` (the same JSON string), so a command holding ``</tool_call>`` cannot end the call early."""
    body = json.dumps({"name": tool, "arguments": {"command": command}}).replace("</", "<\\/")
    return "<tool_call>" + body + "</tool_call>"


class EnvWorkspace:
    """The ``Workspace`` of one episode of a reset SAO env (see the module doc).

    ``exhausted``: whether the gateway's context budget is spent (a command the model wrote into the last room is
    then not run, as SAO's own loop does not run an action that filled the context); ``on_command``: called after
    each command the env ran."""

    def __init__(
        self,
        env: Any,
        task: Any,
        prompt: str,
        *,
        exhausted: Callable[[], bool] = lambda: False,
        tool: str = BASH_TOOL,
        on_command: Callable[[], None] | None = None,
    ) -> None:
        self.env, self.task, self.prompt, self.tool = env, task, prompt, tool
        self._exhausted, self._on_command = exhausted, on_command
        self._loop = asyncio.get_running_loop()
        self._lock = asyncio.Lock()  # one command at a time: the env steps in order
        self.steps = 0
        self.env_s = 0.0
        self.reward = 0.0
        self.info: dict[str, Any] = {}
        self.ended: str | None = None  # "ok" | "truncated" once a step of the env ended the episode
        self.end_reason = ""
        self.infra_error = ""
        self.cancelled = False

    @property
    def task_text(self) -> str:
        if isinstance(self.task, dict) and str(self.task.get("problem_statement") or "").strip():
            return str(self.task["problem_statement"])
        return self.prompt

    async def run(self, command: str) -> CommandResult:
        async with self._lock:
            return await self._run(command)

    async def _run(self, command: str) -> CommandResult:
        if self.cancelled:
            raise EpisodeEnded("error", "the episode was cancelled")
        if self.ended is not None or self.infra_error:
            raise EpisodeEnded(self.end_reason or "error", "the episode has already ended")
        if self._exhausted():
            self.end_reason = "context_length"
            raise EpisodeEnded("context_length", "the context budget is spent; the command was not run")
        t0 = time.perf_counter()
        try:
            obs, reward, terminated, truncated, info = await self.env.astep(bash_call(command, self.tool))
        finally:
            self.env_s += time.perf_counter() - t0
        self.steps += 1
        if self._on_command is not None:
            self._on_command()
        self.reward += float(reward)
        self.info.update(info)
        if info.get("infra_error"):
            self.infra_error = str(info["infra_error"])
            raise EpisodeEnded("error", self.infra_error)
        if terminated or truncated:
            self.ended = "ok" if terminated else "truncated"
            self.end_reason = str(info.get("truncation_reason") or "env")
            self.info["final_observation"] = obs
            raise EpisodeEnded(self.end_reason, f"the env ended the episode ({self.end_reason})")
        if info.get("format_error"):
            # The env did not take the call: it has no tool of that name. No harness can work such an env.
            self.infra_error = f"the env has no {self.tool!r} tool to run commands with: {obs[:200]}"
            raise EpisodeEnded("error", self.infra_error)
        code = info.get("exit_code")
        return CommandResult(obs, -1 if code is None else int(code))

    def run_sync(self, command: str) -> CommandResult:
        if _in_loop(self._loop):
            raise RuntimeError("Workspace.run_sync was called on the event loop's thread; await run() there")
        return asyncio.run_coroutine_threadsafe(self.run(command), self._loop).result()


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


async def in_thread(fn: Callable[[], Any], *, name: str = "sao-harness") -> Any:
    """``fn()`` in a thread of its own (a blocking agent: its commands come back to this loop through
    ``run_sync``). Not the loop's default executor: its few threads would all wait on commands whose steps need
    that same executor (the SWE env grades in it), a deadlock once the episodes in flight outnumber them."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def target() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = fn()
        except BaseException as e:  # handed to the awaiting coroutine, which decides
            error = e
        with contextlib.suppress(RuntimeError):  # the loop is gone (the run ended): nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name=name, daemon=True).start()
    return await done
