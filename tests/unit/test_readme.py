"""The README's commands cannot rot: every `sao ...` line in its bash blocks names a real subcommand whose `--help`
lists each option the line uses, every config file it names exists, and every doc it links to is there. Its toy
line is run as written by tests/integration/trainer/test_toy_learning.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from tests._readme import README, sao_lines

ROOT = Path(__file__).resolve().parents[2]


@cache
def _help(path: tuple[str, ...]) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "sao.cli.main", *path, "--help"]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, env=dict(os.environ, COLUMNS="200")
    )
    return res.returncode, res.stdout + res.stderr


def command_path(argv: list[str]) -> tuple[str, ...]:
    """The longest prefix of ``argv`` (after `sao`) that is a command: `sao eval swebench --x` -> (eval, swebench)."""
    path: tuple[str, ...] = ()
    for word in argv[1:]:
        if word.startswith("-") or "=" in word or "/" in word or "." in word:
            break
        rc, out = _help((*path, word))
        if rc != 0 or "Usage:" not in out:
            break
        path = (*path, word)
    return path


def test_the_readme_has_commands_to_check() -> None:
    lines = sao_lines(README.read_text(encoding="utf-8"))
    assert len(lines) >= 10, lines


@pytest.mark.slow
def test_every_readme_command_exists_with_its_options() -> None:
    problems = []
    for line in sao_lines(README.read_text(encoding="utf-8")):
        argv = shlex.split(line)
        path = command_path(argv)
        if not path:
            problems.append(f"{line!r}: `sao {argv[1]}` is not a command")
            continue
        _, out = _help(path)
        for opt in (w.split("=")[0] for w in argv if w.startswith("--")):
            if opt not in out:
                problems.append(f"{line!r}: `sao {' '.join(path)}` has no option {opt}")
        for word in argv:
            if word.startswith("configs/") and not (ROOT / word).exists():
                problems.append(f"{line!r}: {word} does not exist")
    assert not problems, "README commands out of date:\n" + "\n".join(problems)


def test_every_link_of_the_readme_exists() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [t for t in re.findall(r"\]\(([^)#]+)\)", text) if "://" not in t and not (ROOT / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_the_readme_stays_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 160, (
        "the README is for people arriving: move detail to docs/"
    )


def test_the_three_uses_start_in_the_first_80_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    for use in ("## Evaluate on SWE-bench", "## Register a tool environment", "## Launch training"):
        at = next((n for n, line in enumerate(lines, 1) if line.startswith(use)), None)
        assert at is not None and at <= 80, (
            f"README: the section {use!r} starts at line {at}; the three uses belong in the first 80"
        )


def test_the_checker_sees_a_missing_option() -> None:
    assert command_path(shlex.split("sao eval swebench --nope")) == ("eval", "swebench")
    assert "--nope" not in _help(("eval", "swebench"))[1]
    assert command_path(shlex.split("sao nosuchcommand x")) == ()
