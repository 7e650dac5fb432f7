"""The agent on a real tool env with the real SmolLM2 tokenizer: token-exact turns, format errors, tools text.

The engine is scripted (it replays the tokenization of fixed assistant messages) so that the check is exact:
the concatenated trajectory segments must equal the SmolLM2 ChatML template's rendering of the conversation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sao.agent.chat import ChatRenderer, tools_as_text
from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.loop import AgentConfig, run_episode
from sao.envs.base import Grade, ToolEnv
from sao.envs.protocols import ToolResult
from sao.envs.tools import SubmitTool
from sao.envs.tools._common import function_schema


class ReverseTool:
    name = "reverse"
    schema = function_schema("reverse", "Reverse a text.", {"text": {"type": "string"}}, ["text"])

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(str(arguments.get("text", ""))[::-1])


class ReverseEnv(ToolEnv):
    async def setup(self, task: Any) -> None:
        self.word = task["word"]

    def tools(self) -> list[Any]:
        return [ReverseTool(), SubmitTool(answer_field="answer")]

    def system_prompt(self) -> str:
        return "You solve tasks with tools."

    def task_prompt(self, task: Any) -> str:
        return f"Submit the word {task['word']} spelled backwards."

    async def grade(self, submission: dict[str, Any]) -> Grade:
        ok = submission["answer"].strip() == self.word[::-1]
        return Grade(reward=float(ok), solved=ok)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


ACTIONS = [
    '<tool_call>{"name": "reverse", "arguments": {"text": "critic"}}</tool_call>',
    '<tool_call>{"name": "reverse", "arguments": {text: critic}</tool_call>',  # malformed JSON
    '<tool_call>{"name": "submit", "arguments": {"answer": "citirc"}}</tool_call>',
]


async def test_three_turns_equal_the_chat_template_rendering(tokenizer: Any) -> None:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine([[*tokenizer.encode(a, add_special_tokens=False), eos] for a in ACTIONS], version=7)
    env = ReverseEnv(max_steps=5)
    task = {"word": "critic", "id": "w1"}
    traj = await run_episode(env, engine, tokenizer, AgentConfig(), options={"task": task}, check_render=True)
    assert traj.status == "ok" and traj.reward == 1.0 and traj.task_id == "w1"
    assert traj.info["render_drift"] == 0.0  # the agent's own check agrees with the full rendering below
    assert [s.kind for s in traj.segments] == ["prompt", "action", "observation", "action", "observation", "action"]
    assert all(s.policy_version == 7 for s in traj.action_segments)

    # Malformed tool call: the env answered with a format-error observation the model sees.
    second_obs = tokenizer.decode(list(traj.segments[4].token_ids))
    assert "not valid JSON" in second_obs and "<tool_call>" in second_obs

    # SmolLM2's template has no tool support: tools are in the system prompt, tool results come as "user".
    chat = ChatRenderer(tokenizer)
    assert not chat.native_tools and chat.tool_role == "user"
    first_obs = tokenizer.decode(list(traj.segments[2].token_ids))
    assert first_obs == "\n<|im_start|>user\ncitirc<|im_end|>\n<|im_start|>assistant\n"
    system = "You solve tasks with tools." + tools_as_text(env.tool_schemas())
    msgs = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Submit the word critic spelled backwards."},
        {"role": "assistant", "content": ACTIONS[0]},
        {"role": "user", "content": "citirc"},
        {"role": "assistant", "content": ACTIONS[1]},
        {"role": "user", "content": second_obs.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]},
        {"role": "assistant", "content": ACTIONS[2]},
    ]
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    full = tokenizer.encode(text, add_special_tokens=False)
    # Prefix-stable: everything the model saw is the template's rendering, up to the final "\n" after <|im_end|>.
    assert traj.token_ids == full[:-1] and tokenizer.decode(full[-1:]) == "\n"


async def test_a_length_cut_action_is_closed_by_observation_tokens(tokenizer: Any) -> None:
    ids = tokenizer.encode(ACTIONS[0], add_special_tokens=False)
    engine = ScriptedEngine([ids, ids])
    env = ReverseEnv(max_steps=2)
    traj = await run_episode(env, engine, tokenizer, AgentConfig(max_action_tokens=5), options={"task": {"word": "ab"}})
    assert len(traj.segments[1].token_ids) == 5
    assert tokenizer.decode(list(traj.segments[2].token_ids)).startswith("<|im_end|>\n<|im_start|>user\n")
    # A cut action is closed by the template's tokens: the fresh rendering of the same messages is identical.
    env = ReverseEnv(max_steps=2)
    cfg = AgentConfig(max_action_tokens=5)
    again = await run_episode(env, ScriptedEngine([ids, ids]), tokenizer, cfg, options={"task": {"word": "ab"}},
                              check_render=True)  # fmt: skip
    assert again.info["render_drift"] == 0.0, again.info["render_drift_at"]
    assert traj.status == "truncated"  # the env's step limit (two unparseable cut actions)
