"""Durable files: one JSONL reader (line by line, errors that name the file and line), one durable (fsynced) JSONL
appender, and atomic text / JSON writes (temp file, fsync, rename, folder fsync)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
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


def _line(record: Any) -> str:
    return json.dumps(record, default=str) + "\n"


class JsonlAppender:
    """Durable appends to one JSONL file held open: each ``append`` writes whole lines, then flushes and fsyncs,
    so a crash loses nothing already appended (at worst a torn last line, which ``iter_jsonl(torn_tail_ok=True)``
    skips). The one durable JSONL writer: ``append_jsonl`` is its one-shot form."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held open until close()

    def append(self, *records: Any) -> None:
        self._f.write("".join(_line(r) for r in records))
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def append_jsonl(path: str | Path, records: Iterable[Any]) -> None:
    """Append ``records`` (JSON-serialisable; others via ``str``) to ``path`` as lines, flushed and fsynced."""
    with JsonlAppender(path) as out:
        out.append(*records)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_durably(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temp file, flushed and fsynced, renamed over it, the folder fsynced."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any, indent: int | None = 1) -> None:
    """``obj`` as JSON, written as ``write_text_durably`` does (values JSON cannot hold are written as text)."""
    write_text_durably(path, json.dumps(obj, indent=indent, default=str) + "\n")
