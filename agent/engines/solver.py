"""SolverEngine (model spec ``solver``): writes correct tool-use episodes for the Python-tool arithmetic tasks.

It is an ``Engine`` like any model, so its episodes go through the one episode loop, the env and the sandbox:
demonstrations come from the env itself, with the python tool's real output as the observation. Per turn it
decodes the prompt it is given and acts like a careful tool user:

1. no tool result yet: call the python tool on the task's expression,
   ``<tool_call>{"name": "python", "arguments": {"code": "print(EXPR)"}}</tool_call>``;
2. a tool result came back: answer with the last integer the tool printed, ``\\boxed{N}``
   (if the tool printed no integer, it calls the tool again).

It solves the tasks whose problem reads ``Compute EXPR.`` (``sao.envs.datasets.arithmetic_tasks``); on any other
problem it raises ``EngineError`` (the episode is an infra error, never a fake demonstration). Each token's
logprob is 0.0 (a deterministic policy); the action ends with the template's end-of-turn token.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sao.agent.chat import ChatRenderer
from sao.agent.conversation import action_ids
from sao.agent.engines.protocols import EngineError, Generation, SamplingParams

_PROBLEM = re.compile(r"Compute ([0-9+\-*/() ]+?)\.\s")
_CALL_END = "</tool_call>"
_INT = re.compile(r"-?\d+")


def solver_action(prompt_text: str) -> str:
    """The solver's next action text given the decoded prompt so far (see the module doc)."""
    problems = list(_PROBLEM.finditer(prompt_text))
    if not problems:
        raise EngineError("solver: no 'Compute <expression>.' task in the prompt; it only solves arithmetic tasks")
    expr = problems[-1].group(1).strip()
    cut = prompt_text.rfind(_CALL_END)
    if cut > problems[-1].end():  # the system prompt's tool-format example comes before the task
        numbers = _INT.findall(prompt_text[cut + len(_CALL_END) :])
        if numbers:
            return f"\\boxed{{{numbers[-1]}}}"
    code = json.dumps({"name": "python", "arguments": {"code": f"print({expr})"}})
    return f"<tool_call>{code}</tool_call>"


class SolverEngine:
    """An Engine that writes the solver's actions (see the module doc) as token ids of ``tokenizer``."""

    def __init__(self, tokenizer: Any, version: int = 0) -> None:
        self.chat = ChatRenderer(tokenizer)
        self._version = version
        self.calls = 0

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        text = self.chat.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        ids = action_ids(self.chat, solver_action(text))
        self.calls += 1
        if len(ids) > sampling.max_tokens:
            raise EngineError(
                f"solver: its action needs {len(ids)} tokens but max_tokens is {sampling.max_tokens}; raise it"
            )
        return Generation(tuple(ids), tuple(0.0 for _ in ids), "stop", self._version)

    async def update_weights(self, checkpoint_dir: str, version: int) -> None:
        self._version = version

    async def close(self) -> None:
        return None
