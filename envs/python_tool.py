"""``PythonToolEnv`` (``sao/PythonTool-v0``): a math problem per episode, a sandboxed python tool, math-verify grading.

An episode: the user message is the problem; the model may call ``python`` (notebook-like, in a fresh sandbox
per episode, with a timeout and an output cap; a fenced ```python block counts as a call) any number of times,
and ends by either calling ``submit`` with an ``answer`` or writing a message with no tool call that contains
``\\boxed{...}``. The answer graded is the content of the LAST ``\\boxed{}`` (or the submitted text when it has no
box). Grading: ``math_verify.verify(parse(gold), parse(prediction))``, so ``\\frac{1}{2}`` and ``0.5`` agree.
Reward 1.0 if correct, else 0.0; ``info["report"]`` holds gold, extracted prediction and the verdict. A crash or
timeout of math-verify is an infra error (``GraderError``), never a 0.

Tasks: ``reset(options={"task": {"problem": ..., "answer": ...}})`` (``prompt`` is accepted for ``problem``;
``id``, ``level`` and ``answer_format`` are optional; a task's ``level`` goes to the episode's info, and with
``answer_format: integer`` only an integer answer is graded, not an expression that equals it), or drawn by the
seeded generator from ``dataset``: ``"arithmetic"`` (generated easy problems, the default), ``"arithmetic_chain"``
(levels 1-4), a benchmark name (``aime24``, ``aime25``, ``imo_answerbench``), a local file or an HF dataset (see
``sao.envs.datasets``), or a list of task records.

Sandbox: ``sandbox`` is a ``sao.sandboxes.config.SandboxConfig`` or a dict of its fields (default: bwrap, no
network, 1 GiB of memory and 1 GiB of disk, code run as the unprivileged uid 1000); ``sandbox_factory`` (a
callable returning a Sandbox, or an awaitable of one) overrides it.
Docker sandboxes come from the episode runner's warm pool (``sao.sandboxes.pool.acquire_sandbox``): a fresh
container per episode, destroyed at its end, started ahead of time. The python tool tells the model how a cell
ended when its output cannot: killed for memory, at the timeout or for the disk limit, a signal, an exit code
other than a traceback's 1 (``sao.envs.tools._common.how_it_ended``).
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from sao.envs.base import Grade, ToolEnv
from sao.envs.protocols import Tool
from sao.envs.tools.python import PythonTool
from sao.envs.tools.submit import SubmitTool
from sao.sandboxes.config import SandboxConfig
from sao.sandboxes.factory import sandbox_config_from_dict
from sao.sandboxes.protocols import Sandbox, SandboxError

SYSTEM_PROMPT = (
    "You solve math problems. You may run Python with the python tool; variables persist between calls. "
    "When you are sure, write the final answer as \\boxed{...} in a message without a tool call."
)


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; else None."""
    starts = sorted((m.end(), m.start()) for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text))
    for body_start, _ in reversed(starts):
        depth, j = 1, body_start
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth == 0:
            return text[body_start : j - 1]
    return None


GRADE_TIMEOUT_S = 5
ANSWER_FORMATS = {"integer": re.compile(r"-?\d+")}
"""A task's optional ``answer_format``: the form its answer must have before math-verify compares it."""


class GraderError(SandboxError):
    """math-verify crashed or timed out: an infrastructure error (the episode ends as ``infra_error``, like a
    sandbox failure), never a reward of 0. An answer it parses to nothing is a wrong answer, not an error."""


def grade_answer(gold: str, prediction: str) -> tuple[bool, dict[str, Any]]:
    """``math_verify`` verdict of ``prediction`` (a bare answer) against ``gold``, with the parsed forms.
    Raises ``GraderError`` when math-verify raises or hits its timeout (it would otherwise return False)."""
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    # math-verify enforces its timeouts with SIGALRM, which only the main thread may use.
    main = threading.current_thread() is threading.main_thread()
    ptime: Any = GRADE_TIMEOUT_S if main else None
    gold_text = gold if ("$" in gold or "\\boxed" in gold) else f"${gold}$"
    try:
        gold_parsed = parse(gold_text, parsing_timeout=ptime, raise_on_error=True)
        pred_parsed = parse(f"\\boxed{{{prediction}}}", parsing_timeout=ptime, raise_on_error=True)
        ok = (
            bool(gold_parsed)
            and bool(pred_parsed)
            and verify(gold_parsed, pred_parsed, timeout_seconds=ptime, raise_on_error=True)
        )
    except (Exception, TimeoutException) as e:
        what = "timed out" if isinstance(e, TimeoutException) else "failed"
        raise GraderError(
            f"math-verify {what} grading {prediction[:200]!r} against {gold[:200]!r}: {type(e).__name__}: {e}"
        ) from e
    return ok, {"gold_parsed": [str(x) for x in gold_parsed], "pred_parsed": [str(x) for x in pred_parsed]}


class PythonToolEnv(ToolEnv):
    """Math with a sandboxed python tool (see the module doc)."""

    fenced = {"python": ("python", "code"), "py": ("python", "code")}  # noqa: RUF012

    def __init__(
        self,
        dataset: str | list[dict[str, Any]] = "arithmetic",
        *,
        sandbox: Any = None,
        sandbox_factory: Callable[[], Any] | None = None,
        code_timeout: float = 30.0,
        max_output: int = 8_000,
        n_generated: int = 1000,
        max_steps: int = 10,
        max_wall_s: float = 600.0,
        max_format_errors: int = 3,
    ) -> None:
        super().__init__(max_steps=max_steps, max_wall_s=max_wall_s, max_format_errors=max_format_errors)
        self.dataset, self.n_generated = dataset, n_generated
        self.code_timeout, self.max_output = code_timeout, max_output
        self._factory = sandbox_factory
        # The config its sandboxes are made from (None with a factory): default bwrap; preflight checks its backend.
        self.sandbox_cfg: SandboxConfig | None = None
        if sandbox_factory is None:
            self.sandbox_cfg = (
                sandbox if isinstance(sandbox, SandboxConfig)
                else sandbox_config_from_dict({"backend": "bwrap", **(sandbox or {})})
            )  # fmt: skip
        self._tasks: list[dict[str, Any]] | None = None
        self._sandbox: Sandbox | None = None
        self._task: dict[str, str] = {}

    # ---- tasks --------------------------------------------------------------------------------------------
    def tasks(self) -> list[dict[str, Any]]:
        """The dataset's task records (loaded on first use)."""
        if self._tasks is None:
            from sao.envs.datasets import arithmetic_tasks, chain_levels, load_math_tasks, load_tasks

            if isinstance(self.dataset, list):
                self._tasks = list(self.dataset)
            elif self.dataset == "arithmetic":
                self._tasks = arithmetic_tasks(self.n_generated, seed=0)
            elif chain_levels(self.dataset) is not None:
                self._tasks = load_tasks(self.dataset, num_generated=self.n_generated)
            else:
                self._tasks = load_math_tasks(self.dataset)
            if not self._tasks:
                raise ValueError("PythonToolEnv: the dataset is empty")
        return self._tasks

    def sample_task(self, rng: np.random.Generator) -> dict[str, Any]:
        tasks = self.tasks()
        return tasks[int(rng.integers(0, len(tasks)))]

    def parse_task(self, task: Any) -> dict[str, str]:
        if not isinstance(task, dict):
            raise ValueError(
                f"PythonToolEnv task must be a dict with 'problem' and 'answer', got {type(task).__name__}"
            )
        problem = task.get("problem", task.get("prompt"))
        for name, value in (("problem", problem), ("answer", task.get("answer"))):
            if value is None or not str(value).strip():
                raise ValueError(
                    f"PythonToolEnv task is missing field {name!r} (a task needs 'problem' (or 'prompt') and "
                    f"'answer'); got keys {sorted(task)}"
                )
        parsed = {"id": str(task.get("id", "")), "problem": str(problem), "answer": str(task["answer"]).strip()}
        if task.get("level") is not None:  # a graded-difficulty task (arithmetic_chain): kept in the episode's info
            parsed["level"] = str(task["level"])
        if task.get("answer_format") is not None:
            if task["answer_format"] not in ANSWER_FORMATS:
                raise ValueError(
                    f"PythonToolEnv task answer_format {task['answer_format']!r} is unknown; use one of "
                    f"{sorted(ANSWER_FORMATS)} or leave it out (any form math-verify can compare)"
                )
            parsed["answer_format"] = str(task["answer_format"])
        return parsed

    # ---- ToolEnv hooks ------------------------------------------------------------------------------------
    async def setup(self, task: dict[str, str]) -> None:
        self._task = task
        self._sandbox = await self._make_sandbox()

    async def _make_sandbox(self) -> Sandbox:
        if self._factory is not None:
            made = self._factory()
        else:
            from sao.sandboxes.pool import acquire_sandbox

            assert self.sandbox_cfg is not None
            made = acquire_sandbox(self.sandbox_cfg)
        if inspect.isawaitable(made):
            made = await made
        return made  # type: ignore[no-any-return]

    def tools(self) -> list[Tool]:
        assert self._sandbox is not None
        return [
            PythonTool(self._sandbox, timeout=self.code_timeout, max_output=self.max_output),
            SubmitTool("Submit your final answer and end the episode.", answer_field="answer"),
        ]

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def task_prompt(self, task: dict[str, str]) -> str:
        return task["problem"]

    def task_info(self, task: dict[str, str]) -> dict[str, Any]:
        info: dict[str, Any] = {"task_id": task["id"]} if task["id"] else {}
        if "level" in task:
            info["level"] = int(task["level"])
        return info

    async def on_text(self, text: str) -> dict[str, Any] | None:
        return {"answer": text} if last_boxed(text) is not None else None

    async def grade(self, submission: dict[str, Any]) -> Grade:
        raw = str(submission.get("answer", ""))
        boxed = last_boxed(raw)
        prediction = (boxed if boxed is not None else raw).strip()
        gold = self._task["answer"]
        pattern = ANSWER_FORMATS.get(self._task.get("answer_format", ""))
        if pattern is not None and not pattern.fullmatch(prediction):
            # math-verify would evaluate "446 * 49": a task that asks for the number the tool printed wants the number
            why = f"the task's answer_format is {self._task['answer_format']}: the answer is not of that form"
            return Grade(reward=0.0, solved=False, report={"gold": gold, "prediction": prediction, "correct": False,
                                                           "reason": why})  # fmt: skip
        ok, parsed = grade_answer(gold, prediction) if prediction else (False, {})  # GraderError: infra error
        report = {"gold": gold, "prediction": prediction, "correct": ok, **parsed}
        return Grade(reward=1.0 if ok else 0.0, solved=ok, report=report)

    async def teardown(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            await sandbox.close()
