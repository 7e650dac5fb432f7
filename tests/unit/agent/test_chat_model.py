"""OpenAIChatModel + run_chat_episode against a mocked OpenAI-compatible endpoint; it refuses to train."""

from __future__ import annotations

import json

import httpx
import pytest
from agent_fakes import ScriptedEnv

from sao.agent.chat_loop import run_chat_episode
from sao.agent.engines.openai_chat import NotTrainableError, OpenAIChatModel, tool_call_text
from sao.agent.engines.protocols import EngineError, SamplingParams


def endpoint(replies: list[dict], seen: list[dict], status: int = 200) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        msg = replies[len(seen) - 1]
        return httpx.Response(status, json={"choices": [{"message": msg, "finish_reason": "stop"}]})

    return httpx.MockTransport(handle)


def call(name: str, args: str, cid: str = "c1") -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


async def test_tool_calls_become_env_actions_and_tool_messages() -> None:
    seen: list[dict] = []
    replies = [
        {"role": "assistant", "content": "", "tool_calls": [call("bash", '{"cmd": "ls"}')]},
        {"role": "assistant", "content": "The answer is 4."},
    ]
    tools = [{"type": "function", "function": {"name": "bash"}}]
    env = ScriptedEnv([("a.py", 0.0, False, False, {"role": "tool"}), ("ok", 1.0, True, False, {})], tools=tools)
    model = OpenAIChatModel("http://test/v1", "m", transport=endpoint(replies, seen))
    traj = await run_chat_episode(env, model, task_id="t")
    assert env.actions == ['<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>', "The answer is 4."]
    assert traj.status == "ok" and traj.reward == 1.0 and traj.segments == ()
    assert seen[0]["tools"] == tools
    assert seen[1]["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "a.py"}
    assert seen[1]["messages"][-2]["tool_calls"][0]["id"] == "c1"
    await model.close()


def test_malformed_arguments_stay_unparseable_for_the_env() -> None:
    text = tool_call_text(call("bash", "{cmd: ls"))
    assert text.startswith("<tool_call>") and "{cmd: ls" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>"))


async def test_refuses_to_act_as_a_training_engine() -> None:
    model = OpenAIChatModel("http://test/v1", "m")
    with pytest.raises(NotTrainableError, match="evaluation"):
        await model.generate([1, 2], SamplingParams())
    with pytest.raises(NotTrainableError):
        await model.update_weights("ckpt", 1)
    await model.close()


async def test_endpoint_errors_are_infra_errors() -> None:
    seen: list[dict] = []
    model = OpenAIChatModel("http://test/v1", "m", transport=endpoint([{}] * 9, seen, status=503), max_retries=1)
    with pytest.raises(EngineError, match="failed after 2 tries: HTTP 503"):
        await model.chat([{"role": "user", "content": "hi"}])
    assert len(seen) == 2
    traj = await run_chat_episode(ScriptedEnv([]), model)
    assert traj.status == "infra_error" and "503" in traj.info["infra_error"]
    await model.close()


async def test_busy_answers_are_tried_again_and_rejections_are_not() -> None:
    answers = [429, 502, 200, 400]

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(answers.pop(0), json={"choices": [{"message": {"content": "ok"}}]})

    model = OpenAIChatModel("http://test/v1", "m", transport=httpx.MockTransport(handle), max_retries=3)
    assert (await model.chat([{"role": "user", "content": "hi"}])).content == "ok" and answers == [400]
    with pytest.raises(EngineError, match="rejected the request: HTTP 400"):
        await model.chat([{"role": "user", "content": "hi"}])
    await model.close()


def test_bad_url_is_rejected() -> None:
    with pytest.raises(ValueError, match="http"):
        OpenAIChatModel("localhost:8000", "m")
