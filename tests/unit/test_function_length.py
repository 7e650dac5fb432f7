"""No function outside the tests is longer than ``LIMIT`` lines (def to last line, docstring included): a longer one
holds several steps that want names; split it along them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [f"sao/{part}" for part in ("core", "sandboxes", "envs", "agent", "eval", "trainer", "benchmarks", "cli")]
LIMIT = 80


def too_long(source: str, where: str, limit: int = LIMIT) -> list[str]:
    """``where:line name (n lines)`` of each function or method in ``source`` over ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > limit:
                out.append(f"{where}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_no_function_is_longer_than_the_limit() -> None:
    offenders = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            offenders += too_long(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not offenders, f"functions over {LIMIT} lines; split them along their steps:\n" + "\n".join(offenders)


def test_the_checker_sees_a_long_method_and_spares_a_function_at_the_limit() -> None:
    def lines(n: int, indent: str) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(n))

    at_limit = "def f():\n" + lines(LIMIT - 1, "    ")
    over = "class C:\n    async def g(self):\n" + lines(LIMIT, "        ")
    assert too_long(at_limit + "\n\n" + over, "m.py") == [f"m.py:{LIMIT + 4} g ({LIMIT + 1} lines)"]
