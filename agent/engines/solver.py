"""SolverEngine (model spec ``solver``): writes correct tool-use episodes for the Python-tool arithmetic tasks.

It is an ``Engine`` like any model, so its episodes go through the one episode loop, the env and the sandbox:
demonstrations come from the env itself, with the python tool's real output as the observation. Per turn it
decodes the prompt it is given and acts like a careful tool user:

1. no tool result yet: call the python tool on the task's expression,
   ``<tool_call>{"name": "python", "arguments": {"code": "print(EXPR)"}}</tool_call>``;
2. a tool result came back: answer with the last integer the tool printed, ``\\boxed{N}``
   (if the tool printed no integer, it calls the tool again).

It solves the tasks whose problem reads ``Compute EXPR.`` (``sao.envs.datasets.arithmetic_tasks``) and the chain
tasks (``arithmetic_chain_tasks``: lines ``Step k: EXPR``), one call per step (``print(EXPR)  # step k of L``),
each step's ``ANS`` replaced by the last integer the previous call printed (a call that printed none is run
again), then ``\\boxed{}`` of the last one. On any other problem it raises ``EngineError`` (the episode is an
infra error, never a fake demonstration). Each token's logprob is 0.0 (a deterministic policy); the action ends
with the template's end-of-turn token.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sao.agent.chat import ChatRenderer
from sao.agent.conversation import action_ids
from sao.agent.engines.protocols import EngineError, Generation, SamplingParams
from sao.envs.datasets import CHAIN_ANS

_PROBLEM = re.compile(r"Compute ([0-9+\-*/() ]+?)\.\s")
_CALL_END = "</tool_call>"
_CALL_START = "<tool_call>"
_INT = re.compile(r"-?\d+")
_STEP = re.compile(r"^Step (\d+): ([^\n<]+)", re.M)  # the last step's line ends with the template's end of turn


def _call(expr: str, note: str = "") -> str:
    code = f"print({expr})" + (f"  # {note}" if note else "")
    return _CALL_START + json.dumps({"name": "python", "arguments": {"code": code}}) + _CALL_END


def _chain_action(prompt_text: str) -> str | None:
    """The next action on a chain task (the last ``Step 1:`` in the prompt starts it), None when there is none."""
    start = prompt_text.rfind("Step 1: ")
    if start < 0:
        return None
    steps: list[str] = []
    end = start
    for m in _STEP.finditer(prompt_text, start):
        if int(m.group(1)) != len(steps) + 1:
            break
        steps.append(m.group(2).strip())
        end = m.end()
    printed = []  # the last integer of each tool output since the task, skipping outputs with none
    for chunk in prompt_text[end:].split(_CALL_END)[1:]:
        numbers = _INT.findall(chunk.split(_CALL_START)[0])
        if numbers:
            printed.append(numbers[-1])
    if len(printed) >= len(steps):
        return f"\\boxed{{{printed[-1]}}}"
    step = steps[len(printed)]
    # the comment keeps the count in the policy's own actions: what it needs to know whether a step is left
    return _call(step.replace(CHAIN_ANS, printed[-1]) if printed else step, f"step {len(printed) + 1} of {len(steps)}")


def solver_action(prompt_text: str) -> str:
    """The solver's next action text given the decoded prompt so far (see the module doc)."""
    chain = _chain_action(prompt_text)
    if chain is not None:
        return chain
    problems = list(_PROBLEM.finditer(prompt_text))
    if not problems:
        raise EngineError("solver: no 'Compute <expression>.' task in the prompt; it only solves arithmetic tasks")
    expr = problems[-1].group(1).strip()
    cut = prompt_text.rfind(_CALL_END)
    if cut > problems[-1].end():  # the system prompt's tool-format example comes before the task
        numbers = _INT.findall(prompt_text[cut + len(_CALL_END) :])
        if numbers:
            return f"\\boxed{{{numbers[-1]}}}"
    return _call(expr)


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
