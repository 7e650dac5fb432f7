"""The episode loop for chat endpoints (evaluation): messages in, text / tool calls out, no token ids.

The result is a ``Trajectory`` with no segments (nothing to train on) whose ``info["messages"]`` holds the
conversation; status, reward and timings mean the same as in ``sao.agent.loop.run_episode``. Tool results go back as
``role="tool"`` messages answering the model's call id when the model used function calling, else as user
messages.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from sao.agent.engines.openai_chat import ChatReply
from sao.agent.engines.protocols import EngineError
from sao.agent.protocols import AsyncEnv, agent_ended, env_id_of
from sao.agent.records import Trajectory


class ChatModel(Protocol):
    """Messages in, one reply out (``OpenAIChatModel``, or a script replaying fixed replies)."""

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> ChatReply: ...


async def run_chat_episode(
    env: AsyncEnv,
    model: ChatModel,
    *,
    max_turns: int = 32,
    task_id: str | None = None,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
) -> Trajectory:
    t_start = time.perf_counter()
    timings = {"engine_s": 0.0, "env_s": 0.0, "total_s": 0.0}
    obs, info = await env.areset(seed=seed, options=options)
    timings["env_s"] += time.perf_counter() - t_start
    tools = info.get("tools") or None
    messages: list[dict[str, Any]] = (
        [{"role": "system", "content": info["system_prompt"]}] if info.get("system_prompt") else []
    )
    messages.append({"role": "user", "content": obs})
    status, reward, end_info, turns = "truncated", 0.0, dict[str, Any](info), 0
    for _ in range(max_turns):
        t0 = time.perf_counter()
        try:
            reply: ChatReply = await model.chat(messages, tools)
        except EngineError as e:
            status, end_info["infra_error"] = "infra_error", f"engine: {e}"
            break
        t1 = time.perf_counter()
        obs, r, terminated, truncated, step_info = await env.astep(reply.action_text)
        timings["engine_s"] += t1 - t0
        timings["env_s"] += time.perf_counter() - t1
        turns += 1
        reward += float(r)
        end_info.update(step_info)
        messages.append(reply.as_message())
        if step_info.get("infra_error"):
            status = "infra_error"
            break
        if terminated or truncated:
            status = "ok" if terminated else "truncated"
            end_info["final_observation"] = obs
            break
        if step_info.get("role") == "tool" and reply.tool_calls:
            # The API wants an answer per call id; envs run the first call of a message only.
            for i, call in enumerate(reply.tool_calls):
                text = obs if i == 0 else "Not run: only the first tool call of a message is executed."
                messages.append({"role": "tool", "tool_call_id": str(call.get("id", "")), "content": text})
        else:
            messages.append({"role": "user", "content": obs})
    else:
        end_info["truncation_reason"] = "max_turns"
        extra, grade_info = await agent_ended(env, "max_turns")
        reward += extra
        end_info.update(grade_info)
        if grade_info.get("infra_error"):
            status = "infra_error"
    timings["total_s"] = time.perf_counter() - t_start
    end_info.update(messages=messages, turns=turns)
    tid = task_id or str(info.get("task_id", "unknown"))
    return Trajectory(tid, env_id_of(env), (), reward, status, end_info, timings)  # type: ignore[arg-type]
