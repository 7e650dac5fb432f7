"""``TokenGameEnv`` (``sao/TokenGame-v0``): a cheap multi-turn toy game for learning tests (no sandbox).

Rules. An episode has ``turns`` turns (default 3); a list (``turns=[1, 4]``) makes each task draw its length
from it, uniformly (prompts of very different difficulty when the reward needs every turn right). Each turn the
env shows one symbol drawn from ``symbols`` (default ``A B C``); the rewarded action is determined by that
turn's observation:
- ``rule="copy"`` (default): answer with the symbol shown;
- ``rule="next"``: answer with the symbol after it in ``symbols`` (cyclic), which needs a learned mapping;
- ``rule="mixed"``: each task draws ``copy`` or ``next`` (``next`` with probability ``next_share``) and the prompt
  names it, so prompts of very different difficulty share one run (a policy that only copies solves the copy
  prompts and almost none of the next prompts: the state-dependent value a critic can learn and a running-mean
  baseline cannot).
An answer is read as the first whitespace-separated word of the message, stripped of surrounding punctuation and
quotes, compared case-insensitively. By default the env gives no feedback on correctness: the next observation is
simply the next symbol, and the episode always lasts ``turns`` turns. With ``feedback=True`` each later turn's
observation also counts the mistakes so far (``Turn 3/4 mistakes 1: A``), as a test run or a traceback tells an agent
that its state is bad: with ``reward="all"`` a state with a mistake is worth 0 whatever comes next, and a critic
can read that from the observation.

Rewards. ``reward="all"`` (default): 1.0 on the last step if every turn was right, else 0 — credit must flow back
across turns and through the observation tokens between them. ``reward="partial"``: each right turn pays
``1/turns`` on its own step (sum in [0, 1]). ``info["solved"]`` is "all turns right" in both modes;
``info["turn_correct"]`` says whether this turn was right; the last info carries ``report`` (targets, answers).

Messages are short ASCII so the SmolLM2 chat template renders them in a few tokens. ``info["allowed_actions"]``
(at reset) lists the valid answers, so a trainer on a random-init model can restrict sampling to their tokens.
A task (``options={"task": {"sequence": ["B", "A", "C"], "rule": "next"}}``) fixes the shown symbols (and, for
``rule="mixed"``, the task's rule); otherwise they are drawn with the seeded generator. ``info["rule"]`` (at reset)
is the task's rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sao.envs.base import MultiTurnEnv, Turn

_PUNCT = " \t\n.,;:!?\"'`()[]{}<>*"


class TokenGameEnv(MultiTurnEnv):
    """Answer each turn with the symbol the rule derives from the shown one (rules in the module doc)."""

    def __init__(
        self,
        turns: int | list[int] = 3,
        symbols: str | list[str] = "ABC",
        rule: str = "copy",
        reward: str = "all",
        max_format_errors: int = 1000,
        max_wall_s: float = 600.0,
        next_share: float = 0.5,
        feedback: bool = False,
    ) -> None:
        syms = list(symbols.split() if isinstance(symbols, str) and " " in symbols else symbols)
        lengths = [int(t) for t in (turns if isinstance(turns, list | tuple) else [turns])]
        if not lengths or min(lengths) < 1:
            raise ValueError(f"TokenGame turns must be >= 1 (or a list of such lengths), got {turns}")
        if len(syms) < 2 or len(set(s.lower() for s in syms)) != len(syms) or any(not s.isascii() for s in syms):
            raise ValueError(f"TokenGame symbols must be >= 2 distinct ASCII words, got {syms!r}")
        if rule not in ("copy", "next", "mixed"):
            raise ValueError(f"TokenGame rule must be 'copy', 'next' or 'mixed', got {rule!r}")
        if not 0.0 <= next_share <= 1.0:
            raise ValueError(f"TokenGame next_share must be in [0, 1], got {next_share}")
        if reward not in ("all", "partial"):
            raise ValueError(f"TokenGame reward must be 'all' or 'partial', got {reward!r}")
        # The episode ends by itself after `turns` steps; wrong answers are not format errors.
        super().__init__(max_steps=max(lengths) + 1, max_wall_s=max_wall_s, max_format_errors=max_format_errors)
        self.lengths = sorted(set(lengths))
        self.turns, self.symbols, self.rule, self.reward_mode = max(lengths), syms, rule, reward
        self.next_share = float(next_share)
        self.feedback = bool(feedback)
        self._task_rule = "next" if rule == "next" else "copy"
        self._seq: list[str] = []
        self._answers: list[str] = []
        self._correct: list[bool] = []

    def sample_task(self, rng: np.random.Generator) -> dict[str, Any]:
        n = self.turns if len(self.lengths) == 1 else self.lengths[int(rng.integers(0, len(self.lengths)))]
        task: dict[str, Any] = {"sequence": [self.symbols[int(i)] for i in rng.integers(0, len(self.symbols), size=n)]}
        if self.rule == "mixed":
            task["rule"] = "next" if float(rng.random()) < self.next_share else "copy"
        return task

    def target(self, shown: str) -> str:
        """The rewarded answer for a shown symbol under the current task's rule."""
        if self._task_rule == "copy":
            return shown
        return self.symbols[(self.symbols.index(shown) + 1) % len(self.symbols)]

    def system_prompt(self) -> str:
        return "You play a short game. Reply with one symbol only."

    async def start_episode(self, task: Any) -> tuple[str, dict[str, Any]]:
        if not isinstance(task, dict) or "sequence" not in task:
            raise ValueError("TokenGame task must be a dict with a 'sequence' field (a list of symbols)")
        seq = [str(s) for s in task["sequence"]]
        bad = [s for s in seq if s not in self.symbols]
        if len(seq) not in self.lengths or bad:
            raise ValueError(
                f"TokenGame task 'sequence' must hold {' or '.join(map(str, self.lengths))} symbols from "
                f"{self.symbols}, got {seq!r}"
            )
        rule = str(task.get("rule", "copy" if self.rule == "mixed" else self.rule))
        if rule not in ("copy", "next") or (self.rule != "mixed" and rule != self.rule):
            raise ValueError(
                f"TokenGame task 'rule' must be 'copy' or 'next' (and match the env's rule {self.rule!r} unless it "
                f"is 'mixed'), got {rule!r}"
            )
        self._seq, self._answers, self._correct, self._task_rule = seq, [], [], rule
        how = "the symbol shown" if rule == "copy" else "the symbol after the one shown (cyclic)"
        intro = f"Symbols: {' '.join(self.symbols)}. Rule {rule}: each turn, answer with {how}."
        if self.rule != "mixed":
            intro = f"Symbols: {' '.join(self.symbols)}. Each turn, answer with {how}."
        task_id = "-".join(seq) if self.rule != "mixed" else f"{rule}:{'-'.join(seq)}"
        info = {"task_id": task_id, "allowed_actions": list(self.symbols), "rule": rule}
        return f"{intro}\n{self._turn_text(0)}", info

    def _turn_text(self, i: int) -> str:
        if self.feedback and i > 0:
            return f"Turn {i + 1}/{len(self._seq)} mistakes {self._correct.count(False)}: {self._seq[i]}"
        return f"Turn {i + 1}/{len(self._seq)}: {self._seq[i]}"

    @staticmethod
    def read_answer(action: str) -> str:
        words = action.strip().split()
        return words[0].strip(_PUNCT) if words else ""

    async def take_turn(self, action: str) -> Turn:
        i = len(self._answers)
        answer = self.read_answer(action)
        ok = answer.lower() == self.target(self._seq[i]).lower()
        self._answers.append(answer)
        self._correct.append(ok)
        info: dict[str, Any] = {"turn_correct": ok}
        last = i + 1 == len(self._seq)
        if self.reward_mode == "partial":
            reward = (1.0 / len(self._seq)) if ok else 0.0
        else:
            reward = 1.0 if last and all(self._correct) else 0.0
        if not last:
            return Turn(observation=self._turn_text(i + 1), reward=reward, info=info)
        info["solved"] = all(self._correct)
        info["report"] = {
            "rule": self._task_rule,
            "shown": list(self._seq),
            "targets": [self.target(s) for s in self._seq],
            "answers": list(self._answers),
            "correct": list(self._correct),
        }
        return Turn(observation="Game over.", reward=reward, terminated=True, info=info)
