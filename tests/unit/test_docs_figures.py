"""Every figure in docs/ says where it came from.

The rule, per page ``docs/*.md`` (except the pages in ``NO_MEASUREMENTS``) and per package README the docs index
links to (``INDEXED``): split the page at its ``## `` headings
(the text before the first one is a section too; ``###`` subsections belong to their ``##``). A section that holds
a figure must name a commit and a load.

- A figure: outside fenced code blocks and inline code, a number followed by a unit -- ``s`` after a space (so
  "400s" is not one), or ``ms``, ``min``, ``h``, ``GB``, ``GiB``, ``MB``, ``MiB``, ``KiB``, ``tok/s``, ``%``, ``x``
  with or without a space -- or a ``±``.
- A commit: an id of 7-12 or 40 hex digits in backticks, or after the word "commit"/"commits", or as a bare word
  holding both a digit and a letter. Each one must be a commit of this repository (checked when the history is
  there, i.e. not a shallow clone).
- A load: the word "load" or "quiet". Where the text never said the load, write "load not recorded"; where the
  figures are settings or projections rather than measurements, say so ("not measured: no load").

No page links to itself. (By convention, not checked here: the setup, test-count and CI figures live in
docs/testing.md's table "the figures at a glance", and other pages link there rather than repeat them.)
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
INDEXED = [DOCS.parent / "sandboxes" / "README.md", DOCS.parent / "trainer" / "README.md"]
NO_MEASUREMENTS = {"README.md", "register_algorithm.md", "register_engine.md", "register_env.md", "register_harness.md"}

_FIGURE = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?: s|\s?(?:ms|min|h|GB|GiB|MB|MiB|KiB|tok/s|%|x))(?![\w/])|±")
_HEX = r"(?:[0-9a-f]{40}|[0-9a-f]{7,12})"
_COMMIT = re.compile(rf"`({_HEX})`|\bcommits?\s+({_HEX})\b|\b((?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9]){_HEX})\b")
_LOAD = re.compile(r"\b(?:load|quiet)\b", re.IGNORECASE)


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code: commands and configs hold numbers that are no figures."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.DOTALL))


def sections(text: str) -> list[str]:
    """The page cut at its `## ` headings (outside code blocks); the text before the first heading is one too."""
    return [s for s in re.split(r"(?m)^(?=## )", re.sub(r"```.*?```", "", text, flags=re.DOTALL)) if s.strip()]


def commits(text: str) -> list[str]:
    return [next(g for g in m.groups() if g) for m in _COMMIT.finditer(text)]


def unsourced(text: str) -> list[str]:
    """The first line of every section of ``text`` that holds a figure but names no commit or no load."""
    bad = []
    for section in sections(text):
        if _FIGURE.search(_prose(section)) and not (commits(section) and _LOAD.search(section)):
            bad.append(section.splitlines()[0])
    return bad


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.glob("*.md") if p.name not in NO_MEASUREMENTS) + INDEXED


def test_every_section_with_figures_names_its_commit_and_load() -> None:
    problems = [
        f"{p.relative_to(DOCS.parent)}: {head!r}" for p in _pages() for head in unsourced(p.read_text(encoding="utf-8"))
    ]
    assert not problems, (
        "these sections hold figures without a commit and a load; add a line such as "
        "'Figures: commit abc1234 (git blame -C), load 3-4' (or 'load not recorded'):\n" + "\n".join(problems)
    )


def test_a_figure_without_its_commit_fails() -> None:
    page = "# Page\n\nIntro.\n\n## Bench\n\nThe step took 12.5 s at load 3.\n\n## Other\n\nNo numbers here.\n"
    assert unsourced(page) == ["## Bench"]
    assert unsourced(page.replace("at load 3", "at load 3 (commit `abc1234`)")) == []
    assert unsourced("## A\n\n0.156 ± 0.071, commit 1135613\n") == ["## A"]  # a commit but no load
    assert unsourced("## A\n\n2.25x faster, load 1\n") == ["## A"]  # a load but no commit
    assert unsourced("## A\n\n```\nsao x --timeout 30 s\n```\nHTTP 400s, `--gap 5 s`.\n") == []  # no figures


def test_commit_ids_are_told_from_words_and_numbers() -> None:
    assert commits("`5a39c47`, commits 1135613 and 94ad5c2") == ["5a39c47", "1135613", "94ad5c2"]
    assert commits("it effaced 1234567 decades, `CapEff 000001fffeffffff`") == []


def test_every_commit_the_docs_name_exists() -> None:
    root = DOCS.parent
    res = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=root, capture_output=True, text=True)
    if res.returncode != 0 or res.stdout.strip() != "false":
        pytest.skip("needs the repository's full history (not a shallow clone)")
    named = {c for p in _pages() for c in commits(p.read_text(encoding="utf-8"))}
    missing = [
        c
        for c in sorted(named)
        if subprocess.run(["git", "cat-file", "-e", f"{c}^{{commit}}"], cwd=root, capture_output=True).returncode
    ]
    assert not missing, f"docs/ name commits this repository does not have: {missing}"


def test_no_page_links_to_itself() -> None:
    selfish = [
        p.name for p in DOCS.glob("*.md") if re.search(rf"\]\((?:docs/)?{re.escape(p.name)}\)", p.read_text("utf-8"))
    ]
    assert not selfish, f"these pages link to themselves: {selfish}"
