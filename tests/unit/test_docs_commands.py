"""The docs' commands cannot rot either: every `sao ...` command in docs/*.md and the READMEs (code blocks, with
their backslash continuations, and inline code, which tests/unit/test_readme.py does not read) names a real
subcommand whose `--help` lists each option it uses; the helpers are test_readme's."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.unit.test_readme import _help, command_path

ROOT = Path(__file__).resolve().parents[2]
BACKSLASH = "\\"
PAGES = [*sorted((ROOT / "docs").glob("*.md")), *(ROOT / d / "README.md" for d in (".", "trainer", "sandboxes"))]


def doc_sao_lines(text: str) -> list[str]:
    """The `sao ...` commands of ``text``: lines of its code blocks (joined across a trailing backslash, comments
    cut, a leading `.venv/bin/` dropped) and inline code spans that start with `sao `."""
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL):
        command = ""
        for raw in block.splitlines():
            line = raw.split("  #")[0].strip()
            if not command and not re.match(r"(\.venv/bin/)?sao ", line):
                continue
            command = f"{command} {line.removesuffix(BACKSLASH).strip()}".strip()
            if not line.endswith(BACKSLASH):
                out.append(command)
                command = ""
    out += re.findall(r"`((?:\.venv/bin/)?sao [^`]+)`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
    return [line.removeprefix(".venv/bin/") for line in out]


def test_the_reader_joins_continued_lines_and_reads_inline_code() -> None:
    text = "```bash\nsao eval swebench --model x \\\n    --workers 2  # c\nls\n```\nRun `sao train cfg.yaml`.\n"
    assert doc_sao_lines(text) == ["sao eval swebench --model x --workers 2", "sao train cfg.yaml"]


@pytest.mark.slow
def test_every_docs_command_exists_with_its_options() -> None:
    problems = []
    for page in PAGES:
        for line in doc_sao_lines(page.read_text(encoding="utf-8")):
            argv = shlex.split(line)
            path = command_path(argv)
            name = page.relative_to(ROOT)
            if not path:
                if argv[1:] != ["--help"]:
                    problems.append(f"{name}: {line!r}: `sao {argv[1]}` is not a command")
                continue
            _, out = _help(path)
            for opt in (w.split("=")[0] for w in argv if w.startswith("--")):
                if opt not in out:
                    problems.append(f"{name}: {line!r}: `sao {' '.join(path)}` has no option {opt}")
    assert not problems, "commands in the docs out of date:\n" + "\n".join(problems)
