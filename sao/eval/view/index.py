"""A byte-offset index of a JSONL file that is still being written: each refresh reads only what was appended.

``LineIndex.refresh`` returns the complete lines (ending in a newline) added since the last refresh with their
offsets; a torn last line (a writer mid-append, or killed) waits until its newline arrives. A file that was replaced
(another inode: an atomic rewrite such as a resumed run's ``metrics.jsonl``) or cut shorter than what was indexed is
read again from the start, and the refresh says so (``Refresh.reset``), so the caller drops what it built. Any one
line is read back by its offset (``line``): a viewer keeps summaries in memory and the records on disk.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Refresh:
    """What one refresh found: ``lines`` as ``(line number from 0, byte offset, parsed JSON)``; lines that are not
    JSON are counted in ``bad`` and skipped; ``reset``: the file was replaced or cut, everything is new again."""

    lines: list[tuple[int, int, Any]]
    bad: int = 0
    reset: bool = False


@dataclass
class LineIndex:
    """The offsets of the complete lines of ``path`` seen so far (``offsets[i]`` starts line ``i``)."""

    path: Path
    offsets: list[int] = field(default_factory=list)
    indexed: int = 0  # bytes indexed: the end of the last complete line
    _inode: tuple[int, int] | None = None

    def refresh(
        self, each: Callable[[int, Any], None] | None = None, on_reset: Callable[[], None] | None = None
    ) -> Refresh:
        """Index the lines appended since the last call (none when the file does not exist yet). With ``each``, every
        new line goes to ``each(line number, parsed JSON)`` instead of into ``Refresh.lines``, so a large file is
        folded line by line, never held parsed in memory; ``on_reset`` runs before them when the file was replaced
        or cut (the caller drops what it built)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            reset = bool(self.offsets)
            self.offsets, self.indexed, self._inode = [], 0, None
            if reset and on_reset is not None:
                on_reset()
            return Refresh([], 0, reset)
        inode = (st.st_dev, st.st_ino)
        reset = self._inode is not None and (inode != self._inode or st.st_size < self.indexed)
        if reset:
            self.offsets, self.indexed = [], 0
            if on_reset is not None:
                on_reset()
        self._inode = inode
        if st.st_size == self.indexed:
            return Refresh([], 0, reset)
        out: list[tuple[int, int, Any]] = []
        bad = 0
        with open(self.path, "rb") as f:
            f.seek(self.indexed)
            pos, tail = self.indexed, b""
            while chunk := f.read(_CHUNK):
                data = tail + chunk
                start = 0
                while (nl := data.find(b"\n", start)) >= 0:
                    line = data[start:nl]
                    if line.strip():
                        try:
                            rec = json.loads(line)
                        except ValueError:
                            bad += 1
                        else:
                            if each is not None:
                                each(len(self.offsets), rec)
                            else:
                                out.append((len(self.offsets), pos + start, rec))
                            self.offsets.append(pos + start)
                    start = nl + 1
                pos += start
                tail = data[start:]
            self.indexed = pos
        return Refresh(out, bad, reset)

    def __len__(self) -> int:
        return len(self.offsets)

    def line(self, i: int) -> Any:
        """Line ``i`` (0-based, among the JSON lines indexed), read from disk and parsed."""
        with open(self.path, "rb") as f:
            f.seek(self.offsets[i])
            return json.loads(f.readline())
