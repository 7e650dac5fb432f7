"""docs/register_env.md: its code blocks run as written, register an env that plays and passes check_env."""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym
from gymnasium.utils.env_checker import check_env

DOC = Path(__file__).resolve().parents[3] / "docs" / "register_env.md"


def code_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_the_example_is_short() -> None:
    first = code_blocks()[0]
    assert len([line for line in first.splitlines() if line.strip()]) < 30


def test_doc_snippets_run_and_the_env_works() -> None:
    blocks = code_blocks()
    assert len(blocks) >= 2
    ns: dict[str, object] = {"__name__": "register_env_doc"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), ns)
    assert ns["obs"] == "Submitted." and ns["reward"] == 1.0 and ns["terminated"] is True
    from sao.envs import list_envs

    assert ("sao/Reverse-v0", "Spell a word backwards with a reverse tool.") in list_envs()
    env = gym.make("sao/Reverse-v0")
    check_env(env.unwrapped, skip_render_check=True)
    env.reset(options={"task": {"word": "rollout"}})
    _, reward, *_ = env.step('<tool_call>{"name": "submit", "arguments": {"answer": "wrong"}}</tool_call>')
    assert reward == 0.0
    env.close()
