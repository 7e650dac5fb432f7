"""``OnlineWritingEnv`` (``sao/OnlineWriting-v0``): one-line writing tasks judged by a style that shifts over time.

The online-learning simulation: the task is always the same kind ("Write one short line about <topic>."), but
the hidden judge prefers one style at a time and switches to the next style every ``shift_every`` episodes. A
learner that adapts from each fresh rollout recovers after a shift faster than one averaging stale data.

The judge (deterministic, no model). A style is two checks on the reply's text; the reward is the fraction of
the current style's checks that pass (0, 0.5 or 1.0), and ``info["solved"]`` is reward == 1:

| style      | check 1                                  | check 2                                    |
|------------|------------------------------------------|--------------------------------------------|
| ``brief``  | at most 6 words                          | no comma                                   |
| ``excited``| ends with ``!``                          | mentions the topic word                    |
| ``question``| ends with ``?``                         | starts with what/why/how/who/when/where/do/does/is/are/can |
| ``shout``  | >= 80% of its letters are upper case     | at least 2 words                           |
| ``calm``   | has letters and none is upper case       | no ``!``                                   |

An empty reply scores 0. The schedule: episode k (counted at ``reset``) is judged by
``styles[(k // shift_every) % len(styles)]``. The counter lives in a ``StyleSchedule`` shared by name inside the
process (``schedule="default"``), so every env instance a trainer makes sees the same shift at the same time;
pass a ``StyleSchedule`` object to share one explicitly or isolate a test. ``reveal_style=True`` names the style
in the prompt (an oracle baseline). ``info["report"]`` names the style, the episode index and each check.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from sao.envs.base import MultiTurnEnv, Turn

TOPICS = (
    "rain", "coffee", "cats", "trains", "the sea", "winter", "bread", "music", "robots", "gardens",
    "the moon", "bikes", "books", "snow", "tea", "rivers", "birds", "clocks", "maps", "lamps",
)  # fmt: skip
_QUESTION_WORDS = {"what", "why", "how", "who", "when", "where", "do", "does", "is", "are", "can"}


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9']+", text)


def _letters(text: str) -> list[str]:
    return [c for c in text if c.isalpha()]


Check = Callable[[str, str], bool]
STYLES: dict[str, tuple[tuple[str, Check], tuple[str, Check]]] = {
    "brief": (
        ("at_most_6_words", lambda t, topic: len(_words(t)) <= 6),
        ("no_comma", lambda t, topic: "," not in t),
    ),
    "excited": (
        ("ends_with_exclamation", lambda t, topic: t.rstrip().endswith("!")),
        ("mentions_topic", lambda t, topic: topic.split()[-1].lower() in t.lower()),
    ),
    "question": (
        ("ends_with_question_mark", lambda t, topic: t.rstrip().endswith("?")),
        ("starts_with_question_word", lambda t, topic: bool(_words(t)) and _words(t)[0].lower() in _QUESTION_WORDS),
    ),
    "shout": (
        ("mostly_upper_case", lambda t, topic: bool(_letters(t)) and _upper_share(t) >= 0.8),
        ("at_least_2_words", lambda t, topic: len(_words(t)) >= 2),
    ),
    "calm": (
        ("all_lower_case", lambda t, topic: bool(_letters(t)) and not any(c.isupper() for c in t)),
        ("no_exclamation", lambda t, topic: "!" not in t),
    ),
}


def _upper_share(text: str) -> float:
    letters = _letters(text)
    return sum(c.isupper() for c in letters) / len(letters)


def judge(text: str, topic: str, style: str) -> tuple[float, dict[str, bool]]:
    """The style judge: (reward in [0, 1], each check's verdict)."""
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; choose from {sorted(STYLES)}")
    text = text.strip()
    checks = {name: bool(text) and fn(text, topic) for name, fn in STYLES[style]}
    return sum(checks.values()) / len(checks), checks


class StyleSchedule:
    """The shared episode counter and the style it implies (thread-safe)."""

    _named: dict[str, StyleSchedule] = {}  # noqa: RUF012 - the process-wide registry of shared schedules
    _named_lock = threading.Lock()

    def __init__(self, shift_every: int = 50, styles: tuple[str, ...] | list[str] | None = None) -> None:
        styles = tuple(styles or STYLES)
        unknown = [s for s in styles if s not in STYLES]
        if unknown:
            raise ValueError(f"unknown styles {unknown}; choose from {sorted(STYLES)}")
        if shift_every < 1:
            raise ValueError(f"shift_every must be >= 1 episode, got {shift_every}")
        self.shift_every, self.styles = int(shift_every), styles
        self._episodes = 0
        self._lock = threading.Lock()

    @classmethod
    def shared(cls, name: str, shift_every: int, styles: tuple[str, ...] | list[str] | None) -> StyleSchedule:
        """The process-wide schedule called ``name`` (made on first use with these settings)."""
        with cls._named_lock:
            if name not in cls._named:
                cls._named[name] = cls(shift_every, styles)
            return cls._named[name]

    def style_at(self, episode: int) -> str:
        return self.styles[(episode // self.shift_every) % len(self.styles)]

    def next_episode(self) -> tuple[int, str]:
        """Count one episode; return its index and its style."""
        with self._lock:
            k = self._episodes
            self._episodes += 1
        return k, self.style_at(k)


class OnlineWritingEnv(MultiTurnEnv):
    """One-line writing judged by a shifting style (see the module doc)."""

    def __init__(
        self,
        shift_every: int = 50,
        styles: list[str] | None = None,
        schedule: str | StyleSchedule = "default",
        reveal_style: bool = False,
        max_words: int = 40,
    ) -> None:
        super().__init__(max_steps=1, max_wall_s=600.0, max_obs_chars=2000, max_action_chars=4000)
        self.schedule = (
            schedule if isinstance(schedule, StyleSchedule) else StyleSchedule.shared(schedule, shift_every, styles)
        )
        self.reveal_style, self.max_words = reveal_style, max_words
        self._topic, self._style, self._episode = "", "", 0

    def sample_task(self, rng: np.random.Generator) -> dict[str, Any]:
        return {"topic": TOPICS[int(rng.integers(0, len(TOPICS)))]}

    def system_prompt(self) -> str:
        return "Reply with one short line of text."

    async def start_episode(self, task: Any) -> tuple[str, dict[str, Any]]:
        if not isinstance(task, dict) or not str(task.get("topic", "")).strip():
            raise ValueError("OnlineWriting task must be a dict with a non-empty 'topic' field")
        self._topic = str(task["topic"]).strip()
        self._episode, self._style = self.schedule.next_episode()
        prompt = f"Write one short line about {self._topic}."
        if self.reveal_style:
            prompt += f" Style: {self._style}."
        return prompt, {"task_id": self._topic}

    async def take_turn(self, action: str) -> Turn:
        reward, checks = judge(action, self._topic, self._style)
        if len(_words(action)) > self.max_words:
            reward = 0.0  # one line means one line: long rambles never pay
        report = {"style": self._style, "episode": self._episode, "checks": checks, "topic": self._topic}
        return Turn(
            observation="Thanks.", reward=reward, terminated=True, info={"report": report, "solved": reward == 1}
        )
