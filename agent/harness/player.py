"""``HarnessPlayer``: a ``Harness`` plays an episode of a SAO env; SAO grades it and returns its trajectories.

Per episode: the env is reset (its sandbox, from the runner's warm pool); a gateway session is opened in front of
the engine (or, for a plain OpenAI-compatible endpoint, nothing is recorded); the harness plays through an
``EnvWorkspace`` until its agent stops; the session is closed. Then the outcome, by one rule each:

* the env ended the episode itself (its step or time limit, a dead sandbox): the env graded it there;
* the agent stopped (it submitted, or its own step limit, wall-clock limit or format-error exit cut it, or the
  gateway's context budget ran out): SAO grades what exists (the env's ``aend``: the SWE env diffs the repository
  and grades the patch with its own grader). A submit terminates the episode (``status="ok"``); any other stop
  truncates it, graded, so its return is complete and the trainer treats it as terminal (``info["graded"]``);
* an infra failure (the env's, the harness itself raising) is an ``infra_error``, never a reward; so is a failed
  engine request behind the gateway when the episode then ended by an error or a wall-clock limit (the failure may
  be why). An agent that retried a failed request and went on to submit, or was cut by a step, format-error or
  context limit, made the same rows a run without the failure makes (a failed request records nothing): its
  outcome is the policy's and stands, with ``info["engine_errors"]`` counting the failures.

The trajectories are the session's rows (``SessionRecord.trajectories``): each row is exactly what the engine saw
and sampled, every row carries the episode's reward and status, and ``info`` gains the harness's description
(``harness``), its exit status, the turns (commands run), ``row`` / ``rows`` and ``prefix_breaks``, and anything the
harness reported (``HarnessEnd.info``), which never overwrites the outcome (``solved``, ``graded``); the episode's
timings sit on its last row. An unrecorded endpoint gives one trajectory without segments whose
``info["messages"]`` is the agent's conversation.

The gateway lives while the player is open (``async with player``; the episode runner keeps it open while it
runs); a player used outside that opens one for the episode alone.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sao.agent.engines.protocols import Engine
from sao.agent.episodes import Episode, infra_error_trajectory
from sao.agent.harness.protocols import Endpoint, Harness, HarnessEnd, HarnessLimits
from sao.agent.harness.workspace import EnvWorkspace
from sao.agent.loop import AgentConfig
from sao.agent.protocols import AsyncEnv, agent_ended, env_id_of
from sao.agent.records import Trajectory

GATEWAY_MODEL = "sao-policy"


@dataclass
class HarnessPlayer:
    """Plays episodes with ``harness`` (see the module doc). Give ``engine`` and ``tokenizer`` (a trainable
    engine behind a gateway: the episodes are recorded) or ``endpoint`` (a plain OpenAI-compatible endpoint:
    nothing is recorded). ``agent``: the context budget, tokens per call and temperature of the gateway, and
    ``max_turns``, the agent's step limit. ``wall_s``: the agent's own wall-clock limit (0: the env's)."""

    harness: Harness
    agent: AgentConfig = field(default_factory=AgentConfig)
    engine: Engine | None = None
    tokenizer: Any = None
    endpoint: Endpoint | None = None
    wall_s: float = 0.0
    model_name: str = GATEWAY_MODEL
    on_turn: Callable[[], None] | None = None
    """Called after each command the agent runs (the runner's progress counts turns of episodes in flight)."""

    def __post_init__(self) -> None:
        if (self.engine is None) == (self.endpoint is None):
            raise ValueError("HarnessPlayer needs an engine (recorded through a gateway) or an endpoint, not both")
        if self.engine is not None and self.tokenizer is None:
            raise ValueError("HarnessPlayer: an engine needs its tokenizer (the gateway renders the chat with it)")
        self._gateway: Any = None
        self._opened = 0

    # ---- the gateway's lifetime --------------------------------------------------------------------------------
    async def __aenter__(self) -> HarnessPlayer:
        if self._opened == 0 and self.engine is not None:
            from sao.agent.gateway import Gateway

            a = self.agent
            gateway = Gateway(
                self.engine, self.tokenizer, max_context_tokens=a.max_context_tokens,
                max_action_tokens=a.max_action_tokens, temperature=a.temperature, tool_role=a.tool_role,
                model_name=self.model_name,
            )  # fmt: skip
            await gateway.start()
            self._gateway = gateway
        self._opened += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._opened -= 1
        if self._opened == 0 and self._gateway is not None:
            gateway, self._gateway = self._gateway, None
            await gateway.stop()

    # ---- one episode --------------------------------------------------------------------------------------------
    async def play(self, env: AsyncEnv, episode: Episode) -> list[Trajectory]:
        if self.engine is not None and self._gateway is None:
            async with self:  # used outside a runner: a gateway for this episode alone
                return await self.play(env, episode)
        t0 = time.perf_counter()
        obs, reset_info = await env.areset(seed=episode.seed, options=episode.options)
        reset_s = time.perf_counter() - t0
        task_id = episode.task_id or str(reset_info.get("task_id", "unknown"))
        sid, endpoint = self._open(episode)
        gateway = self._gateway

        def exhausted() -> bool:  # asked before every command: a flag, not a copy of the session's record
            return sid is not None and gateway.context_exhausted(sid)

        workspace = EnvWorkspace(env, episode.task, obs, exhausted=exhausted, on_command=self.on_turn)
        limits = HarnessLimits(self.agent.max_turns, self.wall_s)
        try:
            end = await self.harness.play(workspace, endpoint, limits)
        except Exception as e:  # the harness itself failed: an infra error, whatever its agent did before
            end = HarnessEnd("error", type(e).__name__, error=f"{type(e).__name__}: {e}")
        finally:
            workspace.cancelled = True  # a worker thread still running (a cancelled episode) runs no more commands
            record = gateway.close_session(sid) if sid is not None else None
        status, reward, info = await _outcome(env, workspace, end, record)
        # the harness's own info first: the grader's outcome (solved, graded, its report) is the last word
        info = {**end.info, "turns": workspace.steps, "harness": self.harness.describe(),
                "exit_status": end.exit_status, **info}  # fmt: skip
        timings = {"env_s": reset_s + workspace.env_s, "total_s": time.perf_counter() - t0}
        env_id = env_id_of(env)
        if record is None:
            info["messages"] = end.messages
            return [Trajectory(task_id, env_id, (), reward, status, info, timings)]  # type: ignore[arg-type]
        rows = record.trajectories(task_id=task_id, env_id=env_id, reward=reward, status=status, info=info)
        if not rows:
            why = info.get("infra_error") or end.error or "the agent made no model call that reached the engine"
            return [infra_error_trajectory(task_id, env_id, f"no trajectory: {why}", wall_s=timings["total_s"])]
        # The episode's timings once, on its last row (the one per-episode consumers read).
        engine_s = sum(float(r.timings.get("engine_s", 0.0)) for r in rows)
        rows = [dataclasses.replace(r, timings={}) for r in rows[:-1]] + [
            dataclasses.replace(rows[-1], timings={**timings, "engine_s": engine_s})
        ]
        return rows

    def _open(self, episode: Episode) -> tuple[str | None, Endpoint]:
        """(the gateway session's id or None, the endpoint the agent talks to)."""
        if self._gateway is None:
            assert self.endpoint is not None
            return None, self.endpoint
        sid = f"ep{episode.index}-{uuid.uuid4().hex[:12]}"
        base_url = self._gateway.open_session(sid)
        return sid, Endpoint(base_url, self.model_name, api_key=sid, recorded=True)


async def _outcome(env: AsyncEnv, ws: EnvWorkspace, end: HarnessEnd, record: Any) -> tuple[str, float, dict[str, Any]]:
    """(status, reward, info) of the episode by the rules of the module doc."""
    info: dict[str, Any] = dict(ws.info)
    if ws.infra_error:
        return "infra_error", 0.0, {**info, "infra_error": ws.infra_error}
    engine_errors = record.engine_errors if record is not None else 0
    if engine_errors:
        info["engine_errors"] = engine_errors
    reason: str = "context_length" if record is not None and record.context_exhausted else end.reason
    if ws.ended is not None:  # the env's own limit or a dead sandbox ended it; the env graded it then
        reason = ws.end_reason if ws.ended == "truncated" else "submitted"
    if engine_errors and reason in ("error", "time_limit"):
        # The failure may be why the agent stopped or ran out of time: not the policy's outcome.
        return "infra_error", 0.0, {**info, "infra_error": f"the engine failed {engine_errors} request(s)"}
    if ws.ended is not None:
        return ws.ended, ws.reward, info
    if reason == "error":
        return "infra_error", 0.0, {**info, "infra_error": f"the harness failed: {end.error or end.exit_status}"}
    reward, graded = await agent_ended(env, reason)
    info.update(graded)
    if graded.get("infra_error"):
        return "infra_error", 0.0, info
    if reason == "submitted":
        return "ok", ws.reward + reward, info
    info["truncation_reason"] = reason
    info.setdefault("graded", False)
    return "truncated", ws.reward + reward, info
