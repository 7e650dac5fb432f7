"""The mini-swe-agent demonstrator (model spec ``mini_swe_demonstrator``): works SWE tasks as a bash-only agent would.

The demonstrator for the ``mini_swe_agent`` harness: it answers in mini-swe-agent's text format (a ``THOUGHT:``
line and one ```` ```mswea_bash_command ```` block) behind SAO's gateway, so its episodes are played by the real
mini-swe-agent package in the SWE env's sandbox and hold the commands' real output. It is an ``Engine`` like any
model; its private knowledge is each task's gold ``patch`` (the records it is given), and it finds the episode's
task by the ``<pr_description>`` text of mini-swe-agent's SWE-bench prompt. Per turn it decodes the conversation so
far and takes the next step of the SWE demonstrator's careful engineer (``sao.agent.engines.swe_demonstrator``),
with shell commands only:

1. reproduce: run the first FAIL_TO_PASS test (``python -m pytest -q --tb=short TEST``);
2. locate: print the failing test's source when nothing shown names the bug's function, ``grep -rn`` its
   definition, and show the lines with ``nl -ba FILE | sed -n 'A,Bp'`` (just the line the issue names, when it
   names one);
3. fix: one shell edit per hunk of the patch, a Python heredoc that replaces the text exactly once
   (``assert s.count(old) == 1``), shortest form first (the line alone, then one line of context, then the whole
   hunk, showing lines not yet shown before a longer form); a refused edit exits 1 and the next form follows;
4. check: re-run the FAIL_TO_PASS tests;
5. submit as mini-swe-agent's instructions say, in separate commands: ``git diff -- FILES > patch.txt``,
   ``cat patch.txt``, ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt``.

A task it was not given, a patch it cannot express as edits, or an edit refused in every form raise
``EngineError`` (an infra error, never a fake demonstration). Logprobs are 0.0 (a deterministic policy); an
action longer than ``max_tokens`` is cut there (finish "length"), as a model is.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Generator, Iterable
from typing import Any, cast

from sao.agent.engines.protocols import EngineError
from sao.agent.engines.swe_demonstrator import (
    MAX_CHECKED_TESTS,
    VIEW_MARGIN,
    SWEDemonstratorEngine,
    conversation_after,
    def_lines,
    mentions,
    parse_patch,
    pytest_command,
    replay,
    show_test_command,
)

_PR = re.compile(r"<pr_description>\s*Consider the following PR description:\n(.*?)\n</pr_description>", re.DOTALL)
_RETURNCODE = re.compile(r"<returncode>(-?\d+)</returncode>")
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt"

Step = tuple[str, str]
"""(the THOUGHT sentence, the bash command) of one action."""


def action_text(thought: str, command: str) -> str:
    """One action in mini-swe-agent's text format (``swebench_backticks``)."""
    return f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```"


def view_command(path: str, lo: int, hi: int) -> str:
    """Lines ``lo``-``hi`` of ``path`` with their numbers."""
    return f"nl -ba {shlex.quote(path)} | sed -n '{lo},{hi}p'"


def edit_command(path: str, old: str, new: str) -> str:
    """A shell edit that replaces ``old`` by ``new`` in ``path``, refused (exit 1) unless ``old`` occurs once."""
    return (
        "python - <<'EOF'\nfrom pathlib import Path\n"
        f"p = Path({path!r})\ns = p.read_text()\nold = {old!r}\nnew = {new!r}\n"
        "assert s.count(old) == 1, f'the text to replace occurs {s.count(old)} times, not once'\n"
        "p.write_text(s.replace(old, new))\nprint('edited', p)\nEOF"
    )


def returncode(observation: str) -> int | None:
    m = _RETURNCODE.search(observation)
    return int(m.group(1)) if m else None


def demonstration(task: dict[str, Any]) -> Generator[Step, str, None]:
    """The demonstrator's actions for ``task``: yields a step, is sent the observation that answered it (see the
    module doc). Every argument it writes is text the episode has already shown, except where nothing shown names
    the bug's function (as in the SWE demonstrator)."""
    f2p = list(task["FAIL_TO_PASS"])
    hunks = parse_patch(task["patch"])
    seen = str(task.get("problem_statement", ""))
    seen += "\n" + (yield ("I start by running the failing test to see the failure.", pytest_command(f2p[:1])))
    named = str(task.get("sao_mutation", {}).get("function", "")).rsplit(".", 1)[-1]
    shown_test = False
    views: list[tuple[int, int]] = []
    for h in hunks:
        if h.named_in(seen):
            views.append(h.edit_forms()[0][2])
            thought = f"The issue names the line in {h.path}; I read it."
            seen += "\n" + (yield (thought, view_command(h.path, *views[-1])))
            continue
        lo = max(1, h.start - VIEW_MARGIN)
        function = named if named and len(hunks) == 1 else h.function
        if function:
            if not mentions(seen, function) and not shown_test:
                shown_test = True
                thought = "The failure names only the test; I read the test to see what it calls."
                seen += "\n" + (yield (thought, show_test_command(f2p[0])))
            found = yield (
                f"I find where {function} is defined.",
                f"grep -rn --include='*.py' {shlex.quote(f'def {function}(')} *",
            )
            seen += "\n" + found
            above = [n for n in def_lines(found, h.path) if n <= h.first_change]
            lo = max(above) if above else lo
        views.append((lo, h.start + h.pre_len - 1))
        seen += "\n" + (yield (f"I read the code in {h.path}.", view_command(h.path, *views[-1])))
    yield from _edits(hunks, views)
    yield ("I run the failing tests again to check the fix.", pytest_command(f2p[:MAX_CHECKED_TESTS]))
    files = " ".join(shlex.quote(p) for p in sorted({h.path for h in hunks}))
    yield ("The tests pass; I write the patch of the file I changed.", f"git diff -- {files} > patch.txt")
    yield ("I check that the patch holds only my change.", "cat patch.txt")
    yield ("The patch is right; I submit it.", SUBMIT)


def _edits(hunks: list[Any], views: list[tuple[int, int]]) -> Generator[Step, str, None]:
    """One accepted shell edit per hunk, shortest form first (module doc, step 3)."""
    for h, (lo, hi) in zip(hunks, views, strict=True):
        obs = ""
        for old, new, (a, b) in h.edit_forms():
            if a < lo or b > hi:
                lo, hi = min(lo, a), max(hi, b)
                yield (f"The edit needs more of {h.path}; I read those lines.", view_command(h.path, lo, hi))
            obs = yield (f"I fix the code in {h.path}.", edit_command(h.path, old, new))
            if returncode(obs) == 0:
                break
        else:
            raise EngineError(f"mini_swe_demonstrator: every edit of {h.path} was refused: {obs[:300]}")


def conversation(prompt_text: str) -> tuple[str, list[str]]:
    """(the PR description, the observation that answered each assistant message) of a ChatML prompt of
    mini-swe-agent's SWE-bench config."""
    return conversation_after(prompt_text, _PR, "mini_swe_demonstrator", "<pr_description>")


def next_step(task: dict[str, Any], observations: list[str]) -> Step:
    """The step that follows ``observations`` (one per action so far) in ``task``'s demonstration."""
    return cast(Step, replay(demonstration(task), observations, "mini_swe_demonstrator"))


def mini_swe_demonstrator_engine(
    tokenizer: Any, tasks: Iterable[dict[str, Any]], version: int = 0
) -> SWEDemonstratorEngine:
    """The engine writing this module's bash-only demonstration (module doc) for ``tasks`` as token ids."""
    return SWEDemonstratorEngine(
        tokenizer, tasks, version, name="mini_swe_demonstrator", marker=_PR, what="<pr_description>",
        next_text=lambda task, obs: action_text(*next_step(task, obs)),
    )  # fmt: skip
