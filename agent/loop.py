"""The episode loop: env + engine + tokenizer -> a token-exact Trajectory (prompt / action / observation segments).

Reward placement: each action segment carries the reward of the env step it caused (``Segment.reward``);
``Trajectory.reward`` is their sum (for outcome-reward envs: the final reward, on the last action). When the
agent's own limit (context length, turn cap) ends a running episode, the env grades what exists (``aend``) and
that reward lands on the last action segment.
The last observation (after the env ended the episode) is never shown to the model, so it is not a segment;
its text is kept in ``info["final_observation"]``.

The context budget (``AgentConfig.max_context_tokens``) has one rule: an episode that reaches it ends
"truncated" (``truncation_reason="context_length"``), graded by the env on what exists, and its trajectory never
holds more than the budget. It is reached when an action fills the last room (that action, maybe cut mid-call, is
kept for training but not executed) or when the next observation would leave no room for another action token
(that observation is not appended: it goes to ``info["final_observation"]``, so the trajectory ends on an action).

The end of an episode: every "truncated" trajectory records ``info["graded"]``, whether the env graded the cut
(``on_truncation`` through ``astep`` or ``aend``). A graded cut's return is complete and the trainer treats it as
terminal; an ungraded one (the env did not grade, or has no ``aend``) bootstraps from V after the last action
(``Trajectory.bootstraps``). An env that ends an episode ``truncated`` without saying is taken at Gymnasium's word:
nothing graded it.

Render drift: with ``check_render=True`` the loop renders the whole conversation afresh with the chat template at
the end and compares it with the token ids the model actually saw; ``info["render_drift"]`` is the fraction of
positions that differ (0.0: identical) and ``info["render_drift_at"]`` the first differing position (-1: none).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from sao.agent.chat import ChatRenderer
from sao.agent.engines.protocols import Engine, EngineError, SamplingParams
from sao.agent.protocols import AsyncEnv, agent_ended, env_id_of
from sao.agent.records import Segment, Trajectory
from sao.envs.protocols import ResetInfo

__all__ = ["AgentConfig", "AsyncEnv", "env_id_of", "render_drift", "run_episode"]


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
    top_k: int = 0
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


def render_drift(seen: list[int], fresh: list[int]) -> tuple[float, int]:
    """(fraction of positions where ``seen`` and ``fresh`` differ, over the longer; first differing index or -1)."""
    n = max(len(seen), len(fresh))
    if n == 0:
        return 0.0, -1
    diff = [i for i in range(min(len(seen), len(fresh))) if seen[i] != fresh[i]]
    diff_n = len(diff) + abs(len(seen) - len(fresh))
    first = diff[0] if diff else (min(len(seen), len(fresh)) if len(seen) != len(fresh) else -1)
    return diff_n / n, first


async def run_episode(
    env: AsyncEnv,
    engine: Engine,
    tokenizer: Any,
    cfg: AgentConfig,
    *,
    task_id: str | None = None,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    check_render: bool = False,
) -> Trajectory:
    """Play one episode. Env exceptions propagate (the episode runner records them as infra errors), and so does
    a ``ValueError`` when the first prompt alone fills ``max_context_tokens`` (a config error, not an episode)."""
    chat = ChatRenderer(tokenizer, cfg.tool_role)
    timings = {"engine_s": 0.0, "env_s": 0.0, "total_s": 0.0}
    turns = 0
    t_start = time.perf_counter()
    obs, info = await env.areset(seed=seed, options=options)
    timings["env_s"] += time.perf_counter() - t_start
    task_id, tools, messages, ids = _first_prompt(chat, cfg, task_id, obs, info)
    segments = [Segment("prompt", tuple(ids))]
    status, end_info = "ok", dict[str, Any](info)
    stop_ids = tuple(chat.stop_token_ids())
    seen_before_last: list[int] = list(ids)
    messages_before_last = list(messages)
    try:
        for _turn in range(cfg.max_turns):
            room = cfg.max_context_tokens - len(ids)
            n_max = min(cfg.max_action_tokens, room)
            sp = SamplingParams(n_max, cfg.temperature, cfg.top_p, (), stop_ids, top_k=cfg.top_k)
            t0 = time.perf_counter()
            try:
                gen = await engine.generate(ids, sp)
            except EngineError as e:
                raise _EndEpisode("infra_error", f"engine: {e}") from e
            t1 = time.perf_counter()
            timings["engine_s"] += t1 - t0
            if len(ids) + len(gen.token_ids) >= cfg.max_context_tokens:
                segments.append(Segment("action", gen.token_ids, gen.logprobs, gen.version, 0.0))
                seen_before_last, messages_before_last = list(ids), list(messages)
                turns += 1
                raise _EndEpisode("truncated", "context_length")
            action = chat.action_text(list(gen.token_ids))
            obs, reward, terminated, truncated, step_info = await env.astep(action)
            timings["env_s"] += time.perf_counter() - t1
            turns += 1
            segments.append(Segment("action", gen.token_ids, gen.logprobs, gen.version, float(reward)))
            seen_before_last, messages_before_last = list(ids), list(messages)
            ids = ids + list(gen.token_ids)
            messages.append({"role": "assistant", "content": action})
            end_info.update(step_info)
            if step_info.get("infra_error"):
                raise _EndEpisode("infra_error", str(step_info["infra_error"]))
            if terminated or truncated:
                end_info["final_observation"] = obs
                raise _EndEpisode("ok" if terminated else "truncated", "env")
            message = chat.message(str(step_info.get("role", "user")), obs)
            obs_ids = chat.render_after_action(list(gen.token_ids), message)
            if len(ids) + len(obs_ids) >= cfg.max_context_tokens:
                end_info["final_observation"] = obs
                raise _EndEpisode("truncated", "context_length")
            segments.append(Segment("observation", tuple(obs_ids)))
            ids = ids + obs_ids
            messages.append(message)
        raise _EndEpisode("truncated", "max_turns")
    except _EndEpisode as end:
        status, segments = await _ended(env, end, segments, end_info)
    timings["total_s"] = time.perf_counter() - t_start
    end_info["turns"] = turns
    if check_render:
        # The conversation up to the last action's prompt, rendered at once vs what the model was given.
        fresh = chat.render_full(messages_before_last, tools)
        end_info["render_drift"], end_info["render_drift_at"] = render_drift(seen_before_last, fresh)
    reward = sum(s.reward or 0.0 for s in segments)
    return Trajectory(task_id, env_id_of(env), tuple(segments), reward, status, end_info, timings)  # type: ignore[arg-type]


def _first_prompt(
    chat: ChatRenderer, cfg: AgentConfig, task_id: str | None, obs: str, info: ResetInfo
) -> tuple[str, list[dict[str, Any]] | None, list[dict[str, Any]], list[int]]:
    """(task id, tools, messages, token ids) of the first prompt; the task id is the env's unless given. A first
    prompt that alone fills ``max_context_tokens`` is a config error (``ValueError``)."""
    task_id = task_id or str(info.get("task_id", "unknown"))
    tools = info.get("tools") or None
    messages = chat.initial_messages(info.get("system_prompt"), obs, tools)
    ids = chat.render_prompt(messages, tools)
    if len(ids) >= cfg.max_context_tokens:
        raise ValueError(
            f"task {task_id}: the first prompt is {len(ids)} tokens, max_context_tokens is {cfg.max_context_tokens}; "
            "raise rollout.max_context_tokens or shorten the system prompt / task"
        )
    return task_id, tools, messages, ids


async def _ended(
    env: AsyncEnv, end: _EndEpisode, segments: list[Segment], end_info: dict[str, Any]
) -> tuple[str, list[Segment]]:
    """The episode's status and segments once ``end`` ended it (an agent's limit: graded by the env first)."""
    status = end.status
    if end.reason != "env":
        end_info.setdefault("truncation_reason", end.reason)
    if status == "infra_error":
        end_info["infra_error"] = end.reason
    elif end.reason != "env":
        segments = await _grade_agent_end(env, end.reason, segments, end_info)
        status = "infra_error" if end_info.get("infra_error") else status
    if status == "truncated":
        end_info.setdefault("graded", False)  # the env did not say it graded the cut: reward may be to come
    return status, segments


async def _grade_agent_end(
    env: AsyncEnv, reason: str, segments: list[Segment], end_info: dict[str, Any]
) -> list[Segment]:
    """The agent's limit ended a running episode: the env grades what exists; its reward joins the last action."""
    reward, info = await agent_ended(env, reason)
    end_info.update(info)
    actions = [i for i, s in enumerate(segments) if s.kind == "action"]
    if reward and actions:
        last = segments[actions[-1]]
        segments = list(segments)
        segments[actions[-1]] = dataclasses.replace(last, reward=(last.reward or 0.0) + reward)
    return segments
