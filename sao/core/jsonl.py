"""The one durable writer of the product, and its JSONL reader.

- ``iter_jsonl``: read line by line; errors name the file and line; a torn last line can be skipped.
- ``JsonlAppender`` / ``append_jsonl``: durable appends (fsynced). Before it appends, the appender repairs a torn
  last line (what a kill in the middle of a write leaves): the file is cut back to its last newline and the cut
  bytes are kept in a side file ``NAME.torn-<time>`` beside it, with a warning naming both. Without the repair the
  next record would be glued onto the fragment and lost with it, and the line after that would make the file
  unreadable.
- ``atomic_path`` / ``write_text_durably`` / ``write_json_atomic`` / ``write_yaml_atomic``: whole-file writes that a
  crash leaves old or new, never mixed (a temp file in the same folder, fsynced, renamed over, the folder fsynced).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)


def iter_jsonl(
    path: str | Path, *, torn_tail_ok: bool = False, error: type[Exception] = ValueError, fix: str = ""
) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, parsed value)`` for each non-blank line of ``path``.

    A line that is not JSON raises ``error("PATH:N: not valid JSON (...); FIX")``. With ``torn_tail_ok`` an invalid
    LAST line is skipped instead: what a crash in the middle of an append leaves behind. Lines end at ``\n`` only
    (``str.splitlines`` would also cut at U+2028, U+0085 and the like, which JSON strings may hold unescaped).
    """
    text = Path(path).read_text(encoding="utf-8")
    lines = (text[:-1] if text.endswith("\n") else text).split("\n")
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
    """Durable appends to one JSONL file held open: each ``append`` takes an exclusive ``flock`` (other appenders,
    threads or processes, wait), repairs a torn last line, writes whole lines, fsyncs, then unlocks. So a crash
    loses nothing already appended, and a line torn by a crash costs only that line (kept in a side file). The
    one durable JSONL writer: ``append_jsonl`` is its one-shot form."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)

    def append(self, *records: Any) -> None:
        data = "".join(_line(r) for r in records).encode("utf-8")
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            _repair_torn_tail(self._fd, self.path)
            view = memoryview(data)
            while view:  # a regular file may take a large write in parts
                view = view[os.write(self._fd, view) :]
            os.fsync(self._fd)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_TAIL_CHUNK = 1 << 16


def _repair_torn_tail(fd: int, path: Path) -> None:
    """Cut ``fd``'s file back to just after its last newline when it does not end with one, keeping the cut bytes
    in ``NAME.torn-<UTC time>`` (written and fsynced before the cut) and warning with both names."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    cut = 0
    pos = size
    while pos > 0:
        start = max(0, pos - _TAIL_CHUNK)
        i = os.pread(fd, pos - start, start).rfind(b"\n")
        if i >= 0:
            cut = start + i + 1
            break
        pos = start
    side = _side_file(path)
    with open(side, "xb") as f:
        f.write(os.pread(fd, size - cut, cut))
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(path.parent)
    os.ftruncate(fd, cut)
    os.fsync(fd)
    log.warning(
        "%s ended in a torn line (%d bytes after its last newline, left by a crash mid-write): cut it off before "
        "appending; the bytes are kept in %s",
        path,
        size - cut,
        side,
    )


def _side_file(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    side = path.with_name(f"{path.name}.torn-{stamp}")
    n = 1
    while side.exists():  # two repairs within a second keep both fragments
        side = path.with_name(f"{path.name}.torn-{stamp}-{n}")
        n += 1
    return side


def append_jsonl(path: str | Path, records: Iterable[Any]) -> None:
    """Append ``records`` (JSON-serialisable; others via ``str``) to ``path`` as lines, flushed and fsynced."""
    with JsonlAppender(path) as out:
        out.append(*records)


def fsync_dir(path: Path) -> None:
    """fsync a folder (a rename or a new file in it survives a power cut) or a file, by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` and ``root`` itself (a checkpoint survives a power cut)."""
    for p in [*sorted(root.rglob("*"), reverse=True), root]:
        fsync_dir(p)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temp path beside ``path`` for the caller to write (with any library); when the block ends the temp file is
    fsynced, renamed over ``path`` and the folder fsynced, so a crash leaves the old content or the new one. On an
    error the temp file is removed and ``path`` is untouched. The temp name is hidden and unique (``.NAME.<pid>.<hex>
    .tmp``): folder listings skip it and two writers of one file never share it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        fsync_dir(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text_durably(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically and durably (``atomic_path``)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | Path, obj: Any, indent: int | None = 1, default: Callable[[Any], Any] = str) -> None:
    """``obj`` as JSON, written as ``write_text_durably`` does (values JSON cannot hold go through ``default``)."""
    write_text_durably(path, json.dumps(obj, indent=indent, default=default) + "\n")


def write_yaml_atomic(path: str | Path, obj: Any) -> None:
    """``obj`` as YAML (keys in their order), written as ``write_text_durably`` does."""
    write_text_durably(path, yaml.safe_dump(obj, sort_keys=False))
