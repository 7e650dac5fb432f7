"""Bounded capture of a command's output: keeps the head and the tail, counts what fell in between."""

from __future__ import annotations


def truncation_marker(dropped: int) -> bytes:
    return f"\n[... {dropped} bytes truncated ...]\n".encode()


class OutputCapper:
    """Feed chunks of any total size; memory stays O(``cap``). The first ``cap//2`` bytes and the last
    ``cap - cap//2`` bytes are kept; ``text()`` joins them around a marker saying how many bytes were dropped."""

    def __init__(self, cap: int) -> None:
        if cap < 2:
            raise ValueError(f"output cap must be >= 2 bytes, got {cap}")
        self.cap = cap
        self._head_max = cap // 2
        self._tail_max = cap - self._head_max
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._head_max - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        if len(chunk) >= self._tail_max:
            self._tail = bytearray(chunk[-self._tail_max :])
            return
        self._tail += chunk
        # Trim lazily (at twice the size) so a stream of small chunks costs amortised O(1) per byte.
        if len(self._tail) > 2 * self._tail_max:
            del self._tail[: len(self._tail) - self._tail_max]

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    @property
    def dropped(self) -> int:
        return max(0, self.total - self.cap)

    def data(self) -> bytes:
        tail = bytes(self._tail[-self._tail_max :]) if self._tail else b""
        if not self.truncated:
            return bytes(self._head) + tail
        return bytes(self._head) + truncation_marker(self.dropped) + tail

    def text(self) -> str:
        # errors="replace": a multi-byte character cut at the head/tail boundary must not raise.
        return self.data().decode("utf-8", errors="replace")
