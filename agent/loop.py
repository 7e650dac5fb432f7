"""The episode loop: env + engine + tokenizer -> a token-exact Trajectory (prompt / action / observation segments).

Reward placement: each action segment carries the reward of the env step it caused (``Segment.reward``);
``Trajectory.reward`` is their sum (for outcome-reward envs: the final reward, on the last action).
The last observation (after the env ended the episode) is never shown to the model, so it is not a segment;
its text is kept in ``info["final_observation"]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from agent.chat import ChatRenderer
from agent.engines.protocols import Engine, EngineError, SamplingParams
from agent.records import Segment, Trajectory


class AsyncEnv(Protocol):
    """What the loop needs from an env (the SAO envs' async Gymnasium API)."""

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]: ...

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]: ...


@dataclass(frozen=True)
class AgentConfig:
    """Limits and sampling for one episode.

    ``max_context_tokens``: prompt + all turns must fit (the engine's max model length); reaching it ends the
    episode as "truncated". ``max_action_tokens``: the most tokens sampled per turn. ``max_turns``: a safety
    cap on env steps (envs have their own step limits). ``tool_role``: chat role for tool results ("auto": "tool"
    when the template supports tools, else "user").
    """

    max_context_tokens: int = 2048
    max_action_tokens: int = 256
    max_turns: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    tool_role: str = "auto"

    def __post_init__(self) -> None:
        if self.max_action_tokens < 1 or self.max_context_tokens <= self.max_action_tokens:
            raise ValueError(
                f"AgentConfig: need 1 <= max_action_tokens ({self.max_action_tokens}) < max_context_tokens "
                f"({self.max_context_tokens}); raise max_context_tokens or lower max_action_tokens"
            )


class _EndEpisode(Exception):
    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def env_id_of(env: Any) -> str:
    spec = getattr(env, "spec", None)
    return str(getattr(spec, "id", None) or type(env).__name__)


async def run_episode(
    env: AsyncEnv,
    engine: Engine,
    tokenizer: Any,
    cfg: AgentConfig,
    *,
    task_id: str | None = None,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> Trajectory:
    """Play one episode. Env exceptions propagate (the rollout worker records them as infra errors)."""
    chat = ChatRenderer(tokenizer, cfg.tool_role)
    timings = {"engine_s": 0.0, "env_s": 0.0, "total_s": 0.0}
    turns = 0
    t_start = time.perf_counter()
    obs, info = await env.areset(seed=seed, options=options)
    timings["env_s"] += time.perf_counter() - t_start
    task_id = task_id or str(info.get("task_id", "unknown"))
    tools = info.get("tools") or None
    ids = chat.render_prompt(chat.initial_messages(info.get("system_prompt"), obs, tools), tools)
    segments = [Segment("prompt", tuple(ids))]
    total_reward, status, end_info = 0.0, "ok", dict(info)
    stop_ids = tuple(chat.stop_token_ids())
    try:
        for _turn in range(cfg.max_turns):
            room = cfg.max_context_tokens - len(ids)
            if room < 1:
                raise _EndEpisode("truncated", "context_length")
            sp = SamplingParams(min(cfg.max_action_tokens, room), cfg.temperature, cfg.top_p, (), stop_ids)
            t0 = time.perf_counter()
            try:
                gen = await engine.generate(ids, sp)
            except EngineError as e:
                raise _EndEpisode("infra_error", f"engine: {e}") from e
            t1 = time.perf_counter()
            obs, reward, terminated, truncated, step_info = await env.astep(chat.action_text(list(gen.token_ids)))
            timings["engine_s"] += t1 - t0
            timings["env_s"] += time.perf_counter() - t1
            turns += 1
            segments.append(Segment("action", gen.token_ids, gen.logprobs, gen.version, float(reward)))
            ids = ids + list(gen.token_ids)
            total_reward += float(reward)
            end_info.update(step_info)
            if step_info.get("infra_error"):
                raise _EndEpisode("infra_error", str(step_info["infra_error"]))
            if terminated or truncated:
                end_info["final_observation"] = obs
                raise _EndEpisode("ok" if terminated else "truncated", "env")
            role = str(step_info.get("role", "user"))
            obs_ids = chat.render_after_action(list(gen.token_ids), chat.message(role, obs))
            segments.append(Segment("observation", tuple(obs_ids)))
            ids = ids + obs_ids
            if len(ids) >= cfg.max_context_tokens:
                raise _EndEpisode("truncated", "context_length")
        raise _EndEpisode("truncated", "max_turns")
    except _EndEpisode as end:
        status = end.status
        if end.reason != "env":
            end_info.setdefault("truncation_reason", end.reason)
        if status == "infra_error":
            end_info["infra_error"] = end.reason
    timings["total_s"] = time.perf_counter() - t_start
    end_info["turns"] = turns
    return Trajectory(task_id, env_id_of(env), tuple(segments), total_reward, status, end_info, timings)  # type: ignore[arg-type]
