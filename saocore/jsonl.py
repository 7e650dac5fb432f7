"""Reading JSONL files line by line with errors that name the file and line (one loop for every reader)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_jsonl(
    path: str | Path, *, torn_tail_ok: bool = False, error: type[Exception] = ValueError, fix: str = ""
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, parsed value)`` for each non-blank line of ``path``.

    A line that is not JSON raises ``error("PATH:N: not valid JSON (...); FIX")``. With ``torn_tail_ok`` an invalid
    LAST line is skipped instead: what a crash in the middle of an append leaves behind.
    """
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            if torn_tail_ok and n == len(lines):
                return
            raise error(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno}){'; ' + fix if fix else ''}") from e
        yield n, value
