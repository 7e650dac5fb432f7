"""sao.core.memory: peak windows that do not hide each other, and a trim that hands freed heap holes back."""

from __future__ import annotations

import sys

import pytest

from sao.core import memory

MIB = 2**20
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status and calls glibc")


def _touch(n_bytes: int) -> bytearray:
    buf = bytearray(n_bytes)
    buf[::4096] = b"x" * len(buf[::4096])  # every page resident
    return buf


def test_a_step_window_and_the_run_window() -> None:
    memory.reset_peak_rss()
    base = memory.rss_bytes()
    big = _touch(300 * MIB)
    del big
    first = memory.take_peak_rss()  # the window holding the 300 MiB
    second = memory.take_peak_rss()  # a window with nothing in it
    assert first >= base + 250 * MIB
    assert second < first - 200 * MIB, "taking a window's peak must open a new window"
    assert memory.run_peak_rss() >= first, "the run's peak must keep the peaks of the windows it closed"
    memory.reset_peak_rss()
    assert memory.run_peak_rss() < first - 200 * MIB, "a reset starts the run window again"


def test_trim_hands_back_the_holes_a_fragmented_heap_keeps() -> None:
    # blocks below glibc's mmap threshold live in the heap; keeping every 8th one alive leaves holes that free()
    # alone never returns (the heap's top cannot shrink past a live block): what a training step leaves behind
    blocks = [_touch(96 * 1024) for _ in range(3000)]  # ~280 MiB
    kept = blocks[::8]
    del blocks
    before = memory.rss_bytes()
    memory.trim_heap()
    after = memory.rss_bytes()
    assert before - after > 150 * MIB, f"trim returned only {(before - after) / MIB:.0f} MiB"
    assert len(kept) == 375
