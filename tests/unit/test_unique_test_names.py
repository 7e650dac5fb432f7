"""Test modules need unique basenames: the test folders are not packages, so pytest imports each module by its
basename, and a second ``test_x.py`` anywhere stops the whole collection in a fresh clone ("import file mismatch")
while a warm ``__pycache__`` can hide it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_unique_basename() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    clashes = sorted(n for n, k in names.items() if k > 1)
    assert not clashes, f"test modules sharing a basename (rename one of each): {clashes}"
