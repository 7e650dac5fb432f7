"""SWEDemonstratorEngine (model spec ``swe_demonstrator``): works SWE tasks through the env's own tools.

It is an ``Engine`` like any model, so its episodes go through the one episode loop, the SWE env and its Docker
sandbox: demonstrations hold the tools' real output as observations. Its private knowledge is each task's gold
``patch`` (the records it is given); it finds the episode's task by the ``<issue>`` text in the prompt. Per turn it
decodes the conversation so far and takes the next step of a careful engineer:

1. reproduce: ``bash`` runs the first FAIL_TO_PASS test (``python -m pytest -q --tb=short TEST``);
2. locate: when nothing shown so far (the issue, the traceback) names the function the bug is in, print the failing
   test's source (``grep -n -A 12 'def TEST(' FILE``: a wrong result's traceback names only the test, and the test
   shows what it calls); then ``grep -rn`` the repository for that function's definition (the record's
   ``sao_mutation`` names it; else the last ``def`` above the change in the hunk, else git's hunk header) and
   ``str_replace_editor view`` the file grep printed, from that definition to the hunk's last line. Each argument
   is copied from an earlier observation (``unshown_steps`` lists those that are not: a function no observation
   named); a bug in no known function is viewed from a few lines above its hunk. When the issue names the file
   and the line(s) the bug is on (``instance.with_location_hint`` "line"), it views just those lines instead;
3. fix: one ``str_replace`` per hunk of the patch, as short as the editor takes: a hunk that rewrites one line
   replaces that line's text without its indentation (an action a small model can copy from the view); else, or
   when the editor refuses that (the text is not unique), the changed lines plus one line of context on each
   side; then the whole hunk (after a view of lines it has not shown yet: a refused edit, then a wider view);
4. check: ``bash`` re-runs the FAIL_TO_PASS tests;
5. submit.

A task it was not given, a patch it cannot express as edits (new or deleted files, binary hunks) or an edit the
editor refuses twice raise ``EngineError``: the episode is an infra error, never a fake demonstration. Each token's
logprob is 0.0 (a deterministic policy); each action ends with the template's end-of-turn token, unless it is
cut at ``max_tokens`` (finish "length", as a model is cut: at the context budget the episode ends truncated).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any, cast

from sao.agent.chat import ChatRenderer
from sao.agent.conversation import action_ids
from sao.agent.engines.protocols import EngineError, Generation, SamplingParams
from sao.envs.swe.tasks.instance import line_hint

_ISSUE = re.compile(r"<issue>\n(.*?)\n</issue>", re.DOTALL)
# ChatML (SmolLM2, Qwen): the templates the SWE job runs with.
CHATML_MESSAGE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>", re.DOTALL)
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@ ?(.*)$")
_DEF = re.compile(r"\b(?:async\s+)?def\s+(\w+)\s*\(")
_GREP_LINE = re.compile(r"^(\d+):", re.MULTILINE)
_EDITED = "was edited."
MAX_CHECKED_TESTS = 5
TEST_SOURCE_LINES = 12
VIEW_MARGIN = 4

Call = dict[str, Any]


@dataclass(frozen=True)
class Hunk:
    """One hunk of a unified diff: the file, the first pre-image line, its lines as (" "|"-"|"+", text) and the
    header's context (git writes there the line that opens the enclosing function)."""

    path: str
    start: int
    lines: tuple[tuple[str, str], ...]
    header: str = ""

    @property
    def function(self) -> str | None:
        """The function the change is in, as the hunk shows it: the last ``def`` among the lines above the change,
        else the one the header names (git names the last top-level definition above the hunk), else None."""
        above = self.lines[: self.first_change - self.start]
        for _, text in reversed(above):
            if (m := _DEF.search(text)) is not None:
                return m.group(1)
        m = _DEF.search(self.header)
        return m.group(1) if m else None

    @property
    def first_change(self) -> int:
        """The pre-image line number of the hunk's first changed line."""
        return self.start + next(i for i, (k, _) in enumerate(self.lines) if k != " ")

    def texts(self, context: int | None) -> tuple[str, str]:
        """(old_str, new_str) of the hunk, keeping ``context`` unchanged lines around the change (None: all)."""
        kinds = [k for k, _ in self.lines]
        first = next(i for i, k in enumerate(kinds) if k != " ")
        last = len(kinds) - 1 - next(i for i, k in enumerate(reversed(kinds)) if k != " ")
        if context is None:
            lo, hi = 0, len(kinds) - 1
        else:
            lo, hi = max(0, first - context), min(len(kinds) - 1, last + context)
        part = self.lines[lo : hi + 1]
        old = "\n".join(t for k, t in part if k != "+")
        new = "\n".join(t for k, t in part if k != "-")
        return old, new

    def line_texts(self) -> tuple[str, str] | None:
        """(old_str, new_str) of a hunk that rewrites one line: the two lines without their shared indentation;
        None for any other hunk."""
        changed = [(k, t) for k, t in self.lines if k != " "]
        if [k for k, _ in changed] != ["-", "+"]:
            return None
        old, new = changed[0][1], changed[1][1]
        indent = len(old) - len(old.lstrip())
        if not old.strip() or new[:indent] != old[:indent]:
            return None
        return old[indent:].rstrip(), new[indent:].rstrip()

    def pre_lines(self, context: int | None) -> tuple[int, int]:
        """The first and last pre-image line numbers ``texts(context)`` covers; ``context`` 0: the changed lines
        alone (what ``line_texts`` rewrites)."""
        kinds = [k for k, _ in self.lines]
        first = next(i for i, k in enumerate(kinds) if k != " ")
        last = len(kinds) - 1 - next(i for i, k in enumerate(reversed(kinds)) if k != " ")
        lo, hi = (0, len(kinds) - 1) if context is None else (max(0, first - context), last + context)
        numbers, n = [], self.start
        for i, k in enumerate(kinds):
            if k != "+":
                if lo <= i <= hi:
                    numbers.append(n)
                n += 1
        return (min(numbers), max(numbers)) if numbers else (self.first_change, self.first_change)

    def edit_forms(self) -> list[tuple[str, str, tuple[int, int]]]:
        """The (old_str, new_str, pre-image lines it spans) forms to try, shortest first, without repeats."""
        forms = [
            (self.line_texts(), self.pre_lines(0)),
            (self.texts(context=1), self.pre_lines(1)),
            (self.texts(context=None), self.pre_lines(None)),
        ]
        out: list[tuple[str, str, tuple[int, int]]] = []
        for texts, span in forms:
            if texts is not None and all(texts != (o, n) for o, n, _ in out):
                out.append((*texts, span))
        return out

    def edits(self) -> list[tuple[str, str]]:
        """The (old_str, new_str) forms to try, shortest first, without repeats."""
        return [(old, new) for old, new, _ in self.edit_forms()]

    def named_in(self, text: str) -> bool:
        """Whether ``text`` names this hunk's file and the line(s) it rewrites as ``instance.with_location_hint``
        writes them ("`PATH` ... The bug is on line N." / "lines N-M.")."""
        return f"`{self.path}`" in text and line_hint(*self.pre_lines(0)) in text

    @property
    def pre_len(self) -> int:
        return sum(k != "+" for k, _ in self.lines)


def parse_patch(patch: str) -> list[Hunk]:
    """The hunks of a text patch that only modifies existing files; ``EngineError`` for anything else."""
    hunks: list[Hunk] = []
    path = ""
    cur: list[tuple[str, str]] | None = None
    start, header = 0, ""

    def close() -> None:
        if cur:
            hunks.append(Hunk(path, start, tuple(cur), header))

    for line in patch.splitlines():
        if line.startswith("diff --git "):
            close()
            cur = None
        elif line.startswith(("new file mode", "deleted file mode", "rename from", "Binary files", "GIT binary")):
            raise EngineError(f"swe_demonstrator: the gold patch does more than edit files ({line!r})")
        elif line.startswith("+++ "):
            path = line[4:].removeprefix("b/")
        elif line.startswith("--- "):
            continue
        elif (m := _HUNK.match(line)) is not None:
            close()
            cur, start, header = [], int(m.group(1)), m.group(3).strip()
        elif cur is not None and line[:1] in (" ", "-", "+"):
            cur.append((line[0], line[1:]))
        elif cur is not None and line == "":
            cur.append((" ", ""))
    close()
    if not hunks:
        raise EngineError("swe_demonstrator: the gold patch has no hunks")
    return hunks


def _tool(name: str, **arguments: Any) -> Call:
    return {"name": name, "arguments": arguments}


def pytest_command(tests: list[str]) -> str:
    return "python -m pytest -q --tb=short " + " ".join(shlex.quote(t) for t in tests)


def mentions(text: str, name: str) -> bool:
    """Whether ``name`` stands in ``text`` as a whole identifier."""
    return re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text) is not None


def show_test_command(test_id: str) -> str:
    """The command that prints a test's source: ``grep -n -A N 'def NAME(' FILE`` from its id (``FILE::[Class::]
    NAME[params]``), every part of which the issue shows."""
    path, *_, name = test_id.split("::")
    name = name.split("[", 1)[0]
    return f"grep -n -A {TEST_SOURCE_LINES} {shlex.quote(f'def {name}(')} {shlex.quote(path)}"


def def_lines(found: str, path: str) -> list[int]:
    """The line numbers of ``path`` in a ``grep -rn`` output (``PATH:LINE:text`` lines)."""
    return [int(n) for n in re.findall(rf"^{re.escape(path)}:(\d+):", found, re.MULTILINE)]


def demonstration(task: dict[str, Any]) -> Generator[Call, str, None]:
    """The demonstrator's calls for ``task``: yields a call, is sent that call's observation (see the module doc).

    Every argument it writes is text the episode has already shown (the issue, a test id, a traceback, a test's
    source, a grep's output), so that a policy can learn the step by copying; the gold patch only decides which of
    the shown names to follow. Where nothing shown names the bug's function, it still greps that name (a step no
    policy can infer, counted by :func:`unshown_steps`)."""
    f2p = list(task["FAIL_TO_PASS"])
    hunks = parse_patch(task["patch"])
    seen = str(task.get("problem_statement", ""))
    seen += "\n" + (yield _tool("bash", command=pytest_command(f2p[:1])))
    # the bug's function when the record names it (offline tasks: ``sao_mutation``), else what the hunk shows
    named = str(task.get("sao_mutation", {}).get("function", "")).rsplit(".", 1)[-1]
    shown_test = False
    views: list[tuple[int, int]] = []
    for h in hunks:
        if h.named_in(seen):
            # the issue names the file and the line(s): view just what the first edit form spans (it holds the
            # changed lines; a refused edit brings a wider view first)
            views.append(h.edit_forms()[0][2])
            seen += "\n" + (yield _tool("str_replace_editor", command="view", path=h.path, view_range=list(views[-1])))
            continue
        lo = max(1, h.start - VIEW_MARGIN)
        function = named if named and len(hunks) == 1 else h.function
        if function:
            if not mentions(seen, function) and not shown_test:
                # a wrong result's traceback names only the test: its source shows what it calls
                shown_test = True
                seen += "\n" + (yield _tool("bash", command=show_test_command(f2p[0])))
            pattern = shlex.quote(f"def {function}(")
            found = yield _tool("bash", command=f"grep -rn --include='*.py' {pattern} *")
            seen += "\n" + found
            # the last definition of that name above the change in the hunk's file: the one the change is in
            above = [n for n in def_lines(found, h.path) if n <= h.first_change]
            lo = max(above) if above else lo
        # The hunk's own last line always exists (a margin below could pass the end of the file).
        views.append((lo, h.start + h.pre_len - 1))
        seen += "\n" + (yield _tool("str_replace_editor", command="view", path=h.path, view_range=list(views[-1])))
    for h, (lo, hi) in zip(hunks, views, strict=True):
        obs = ""
        for old, new, (a, b) in h.edit_forms():
            if a < lo or b > hi:
                # a longer form holds lines the view did not show: view them first (only after a narrow view)
                lo, hi = min(lo, a), max(hi, b)
                yield _tool("str_replace_editor", command="view", path=h.path, view_range=[lo, hi])
            obs = yield _tool("str_replace_editor", command="str_replace", path=h.path, old_str=old, new_str=new)
            if _EDITED in obs:
                break
        else:
            raise EngineError(f"swe_demonstrator: the editor refused the gold edit of {h.path}: {obs[:300]}")
    yield _tool("bash", command=pytest_command(f2p[:MAX_CHECKED_TESTS]))
    yield _tool("submit")


def unshown_steps(task: dict[str, Any], calls: list[Call], observations: list[str]) -> list[str]:
    """The names and paths in a demonstration's grep and view calls that nothing shown before them contained
    (the issue, earlier observations): the steps a policy imitating it would have to guess. ``calls[i]`` was
    answered by ``observations[i]``."""
    seen = str(task.get("problem_statement", ""))
    out: list[str] = []
    for call, obs in zip(calls, observations, strict=False):
        args = call.get("arguments", {})
        command = str(args.get("command", ""))
        if call.get("name") == "bash" and (m := re.search(r"def (\w+)\(", command)) is not None:
            out += [m.group(1)] if not mentions(seen, m.group(1)) else []
        elif call.get("name") == "str_replace_editor" and command == "view":
            path = str(args.get("path", ""))
            out += [path] if path not in seen else []
        seen += "\n" + obs
    return out


def conversation_after(prompt_text: str, marker: re.Pattern[str], name: str, what: str) -> tuple[str, list[str]]:
    """(the text ``marker`` captures in the first user message it matches, the observations that followed each
    assistant message after it) from a ChatML prompt; ``name`` (the demonstrator) and ``what`` (the marker's tag)
    make the error."""
    messages = [(m.group(1), m.group(2)) for m in CHATML_MESSAGE.finditer(prompt_text)]
    at = next((i for i, (role, text) in enumerate(messages) if role == "user" and marker.search(text)), None)
    if at is None:
        raise EngineError(
            f"{name}: the prompt holds no task it knows ({marker.pattern[:40]}...); it only works SWE tasks"
        )
    found = marker.search(messages[at][1])
    assert found is not None
    observations = [messages[i + 1][1] if i + 1 < len(messages) else "" for i in range(at + 1, len(messages))
                    if messages[i][0] == "assistant"]  # fmt: skip
    return found.group(1).strip(), observations


def conversation_after_issue(prompt_text: str) -> tuple[str, list[str]]:
    """(the issue text, the observations that followed each assistant message after it) from a ChatML prompt."""
    return conversation_after(prompt_text, _ISSUE, "swe_demonstrator", "<issue>")


def replay(script: Generator[Any, str, None], observations: list[str], name: str) -> Any:
    """The step a demonstration ``script`` (a generator fed one observation per step) takes after ``observations``."""
    step = next(script)
    try:
        for obs in observations:
            step = script.send(obs)
    except StopIteration:
        raise EngineError(f"{name}: the episode went on after its submit") from None
    return step


def next_call(task: dict[str, Any], observations: list[str]) -> Call:
    """The call that follows ``observations`` (one per call made so far) in ``task``'s demonstration."""
    return cast(Call, replay(demonstration(task), observations, "swe_demonstrator"))


def tasks_by_issue(tasks: Iterable[dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    """SWE records by their problem statement (how a demonstrator finds its task in a prompt); two records with one
    statement and different fixes cannot be told apart and are refused."""
    by_issue: dict[str, dict[str, Any]] = {}
    for t in tasks:
        key = str(t["problem_statement"]).strip()
        other = by_issue.get(key)
        if other is not None and other["patch"] != t["patch"]:
            raise ValueError(
                f"{name}: tasks {other['instance_id']} and {t['instance_id']} share a problem statement but not a "
                "fix; it cannot tell them apart (drop one of them)"
            )
        by_issue[key] = t
    if not by_issue:
        raise ValueError(f"{name}: no tasks given; it works the SWE records it is given (--tasks)")
    return by_issue


class SWEDemonstratorEngine:
    """An Engine that writes a demonstrator's actions for ``tasks`` as token ids of ``tokenizer``: by default this
    module's (tool calls of the SWE env); ``name`` / ``marker`` / ``next_text`` make another script's engine (the
    task found by ``marker`` in the prompt, the action text from ``next_text(task, observations)``)."""

    def __init__(
        self,
        tokenizer: Any,
        tasks: Iterable[dict[str, Any]],
        version: int = 0,
        *,
        name: str = "swe_demonstrator",
        marker: re.Pattern[str] = _ISSUE,
        what: str = "<issue>",
        next_text: Callable[[dict[str, Any], list[str]], str] | None = None,
    ) -> None:
        self.chat = ChatRenderer(tokenizer)
        self._version = version
        self.name, self.marker, self.what = name, marker, what
        self.next_text = next_text or (lambda task, obs: f"<tool_call>{json.dumps(next_call(task, obs))}</tool_call>")
        self.by_issue = tasks_by_issue(tasks, name)

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        text = self.chat.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        issue, observations = conversation_after(text, self.marker, self.name, self.what)
        task = self.by_issue.get(issue)
        if task is None:
            raise EngineError(f"{self.name}: the prompt's task is none of the tasks it was given")
        ids = action_ids(self.chat, self.next_text(task, observations))
        if len(ids) > sampling.max_tokens:
            # Cut where a model would be cut (finish "length"): when the cap is the context budget's room, the
            # episode loop ends the episode truncated by its one budget rule (it used to be an infra error of the
            # engine, which the smoke's small budget hit on some task sets); when it is rollout.max_tokens, the
            # env sees a cut call and the stage's summary counts the demonstration as unsolved.
            ids = ids[: sampling.max_tokens]
            return Generation(tuple(ids), tuple(0.0 for _ in ids), "length", self._version)
        return Generation(tuple(ids), tuple(0.0 for _ in ids), "stop", self._version)

    async def update_weights(self, checkpoint_dir: str, version: int) -> None:
        self._version = version

    async def close(self) -> None:
        return None
