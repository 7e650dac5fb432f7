"""This process's resident memory: the current and peak resident set, peak windows, and handing freed heap back.

Linux reports a process's resident set (``VmRSS``) and its high-water mark (``VmHWM``) in ``/proc/self/status``;
writing ``5`` to ``/proc/self/clear_refs`` resets the mark to the current resident set, which opens a new window.
``take_peak_rss`` reads one window's peak and opens the next (e.g. one per training step) while ``run_peak_rss``
still answers for everything since ``reset_peak_rss`` (e.g. a whole stage), so the two never hide each other.

``trim_heap`` exists because glibc keeps freed heap memory: a training step allocates and frees gigabytes of
activations, gradients and weight copies in pieces below its mmap threshold, and the holes it frees stay resident.
Measured on SmolLM2 (one SAO learner step of 8 quickstart-sized trajectories per iteration, nothing else kept): the
resident set grew by ~390 MB a step while the live tensors stayed the same; with ``malloc_trim(0)`` after each step it
stayed flat. Where ``/proc`` or glibc is missing (not Linux, musl), the readers return 0 and the trim does nothing.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_carried = 0  # the highest window peak ``take_peak_rss`` closed since the last ``reset_peak_rss`` (bytes)


def _status_bytes(field: str) -> int:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_bytes() -> int:
    """The resident set now (``VmRSS``); 0 where the kernel does not say."""
    return _status_bytes("VmRSS")


def _reset_mark() -> None:
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:  # not Linux, or a kernel without it: the mark then only ever rises
        pass


def reset_peak_rss() -> None:
    """Start a run window (and a window): ``run_peak_rss`` and ``take_peak_rss`` count from here."""
    global _carried
    _carried = 0
    _reset_mark()


def take_peak_rss() -> int:
    """The peak resident set of the window that ends now (since the last take or reset), and open the next one."""
    global _carried
    peak = _status_bytes("VmHWM")
    _carried = max(_carried, peak)
    _reset_mark()
    return peak


def run_peak_rss() -> int:
    """The peak resident set since the last ``reset_peak_rss`` (or since the process started), every window in it."""
    return max(_carried, _status_bytes("VmHWM"))


def trim_heap() -> None:
    """Hand the heap memory glibc holds free back to the system (``malloc_trim(0)``, every arena); cheap next to a
    training step (tens of ms), after which the resident set tracks live memory again."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
