"""What a person sees: our messages and one-line progress on the terminal, third-party output in a log file.

``third_party_to_log(path)`` sends everything written to the process's stdout and stderr file descriptors (progress
bars of transformers / datasets / huggingface_hub, DeepSpeed's warnings and op builds, C-level logs, child
processes) to ``path``. Python-level writes are routed by who wrote them: a ``print`` or echo from SAO's own
packages (and rich / click, which we print through) still reaches the terminal; everything else goes to the log.
``say(msg)`` prints one of our lines; ``ProgressLine`` is a live ``label done/total [bar] elapsed<eta status`` line
that fits 80 columns, for anything a person waits for (training steps, evals, SFT, image builds, setup).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

#: Top-level packages whose Python-level writes are ours (they reach the terminal while third parties are logged).
OUR_PACKAGES = frozenset({"sao", "__main__", "rich", "click", "typer"})
MAX_WIDTH = 80

_terminal: TextIO | None = None  # the real stderr while third-party output is redirected
_live: ProgressLine | None = None  # the progress line on screen, redrawn after a message


def terminal() -> TextIO:
    """The stream for our own output: the real terminal (stderr) even while third-party output is logged."""
    return _terminal if _terminal is not None else sys.stderr


def say(message: str) -> None:
    """Print one of our messages on the terminal (above the live progress line, if one is shown)."""
    out = terminal()
    live = _live
    if live is not None and live.in_place:
        out.write("\r\x1b[K")
    out.write(message.rstrip("\n") + "\n")
    if live is not None and live.in_place:
        live.redraw()
    out.flush()


def eta_text(elapsed_s: float, done: int, total: int) -> str:
    """``"~m:ss left"`` at the rate so far (``"? left"`` before the first unit), for log lines of long loops."""
    if done <= 0:
        return "? left"
    return f"~{_fmt_s(elapsed_s / done * max(total - done, 0))} left"


def _fmt_s(seconds: float) -> str:
    s = int(max(seconds, 0.0))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class ProgressLine:
    """``LABEL done/total [####----] elapsed<eta STATUS`` on one line of at most 80 columns (``total`` None or 0:
    ``LABEL done elapsed STATUS``).

    On a terminal the line is redrawn in place; on a pipe or file one line is written per update at most every
    ``every_s`` seconds (and the last one), so logs stay short. ``enabled=False`` shows nothing.
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        *,
        done: int = 0,
        status: str = "",
        enabled: bool = True,
        stream: TextIO | None = None,
        every_s: float = 10.0,
        bar_width: int = 10,
    ) -> None:
        self.label, self.total, self.done = label, max(int(total or 0), 0), int(done)
        self.enabled, self.every_s, self.bar_width = enabled, every_s, bar_width
        self.status = status
        self._stream = stream
        self._done0, self._t0 = self.done, time.monotonic()
        self._work_done, self._work_total = 0.0, 0.0
        self._last_write = 0.0
        out = self.stream
        self.in_place = enabled and bool(getattr(out, "isatty", lambda: False)())
        self._stop = threading.Event()
        if enabled:
            global _live
            _live = self
            self._write(force=True)
        if self.in_place:  # the clock keeps ticking between updates: a long first step does not look hung
            threading.Thread(target=self._tick, name="sao-progress", daemon=True).start()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception):
                self.redraw()

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else terminal()

    def width(self) -> int:
        cols = shutil.get_terminal_size((MAX_WIDTH, 24)).columns if self.in_place else MAX_WIDTH
        return max(min(cols, MAX_WIDTH) - 1, 20)

    def eta_s(self) -> float | None:
        """Seconds left at the rate seen since this line started; None before the first unit is done. With
        ``set_work`` the rate is that of the finer work units (e.g. turns of episodes still in flight)."""
        if self._work_total > 0:
            done, left = self._work_done, max(self._work_total - self._work_done, 0.0)
        else:
            done, left = float(self.done - self._done0), float(max(self.total - self.done, 0))
        if done <= 0:
            return None
        return left / (done / max(time.monotonic() - self._t0, 1e-9))

    def set_work(self, done: float, total: float) -> None:
        """Time the ETA by finer units than the shown count: when many units run at once (32 episodes in
        flight), the count sits at 0 while work advances, and its first step gives a wild rate."""
        self._work_done, self._work_total = float(done), float(total)

    def render(self) -> str:
        """The line as text (what is shown), cut to ``width()`` characters."""
        elapsed = _fmt_s(time.monotonic() - self._t0)
        if self.total:
            filled = int(min(self.done / self.total, 1.0) * self.bar_width)
            bar = "#" * filled + "-" * (self.bar_width - filled)
            eta = self.eta_s()
            text = f"{self.label} {self.done}/{self.total} [{bar}] {elapsed}<{_fmt_s(eta) if eta is not None else '?'}"
        else:  # an open-ended count: no bar, no ETA
            text = f"{self.label} {self.done} {elapsed}"
        if self.status:
            text += f" {self.status}"
        w = self.width()
        return text if len(text) <= w else text[: w - 1] + "~"

    def update(self, done: int, status: str | None = None) -> None:
        """Set the units done (and the status text); redraw."""
        self.done = int(done)
        if status is not None:
            self.status = status
        self._write(force=bool(self.total) and self.done >= self.total)

    def advance(self, n: int = 1, status: str | None = None) -> None:
        self.update(self.done + n, status)

    def redraw(self) -> None:
        if self.enabled and self.in_place:
            self.stream.write("\r\x1b[K" + self.render())
            self.stream.flush()

    def _write(self, force: bool = False) -> None:
        if not self.enabled:
            return
        if self.in_place:
            self.redraw()
            return
        now = time.monotonic()
        if force or now - self._last_write >= self.every_s:
            self._last_write = now
            self.stream.write(self.render() + "\n")
            self.stream.flush()

    def close(self) -> None:
        """Leave the final line on screen."""
        global _live
        self._stop.set()
        if not self.enabled:
            return
        if _live is self:
            _live = None
        if self.in_place:
            self.redraw()
            self.stream.write("\n")
        elif self._last_write == 0.0 or not self.total or self.done < self.total:
            self.stream.write(self.render() + "\n")
        self.stream.flush()
        self.enabled = False

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _Router:
    """A ``sys.stdout`` / ``sys.stderr`` stand-in: writes from our packages go to the terminal, others to the log."""

    def __init__(self, ours: TextIO, theirs: TextIO) -> None:
        self._ours, self._theirs = ours, theirs

    def _target(self) -> TextIO:
        frame = sys._getframe(2)  # 0: here, 1: write/isatty, 2: whoever called it (print is a builtin: no frame)
        module = str(frame.f_globals.get("__name__", ""))
        return self._ours if module.split(".", 1)[0] in OUR_PACKAGES else self._theirs

    def write(self, text: str) -> int:
        return self._target().write(text)

    def writelines(self, lines: Any) -> None:
        self._target().writelines(lines)

    def flush(self) -> None:
        self._ours.flush()
        self._theirs.flush()

    def isatty(self) -> bool:
        # Our rich displays stay live on a terminal; third-party bars see a file and write plain lines to the log.
        return bool(self._target().isatty())

    def fileno(self) -> int:
        return self._theirs.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._theirs, name)


@contextlib.contextmanager
def third_party_to_log(path: str | Path) -> Iterator[Path]:
    """Send third-party output (file descriptors 1 and 2, and Python writes from other packages) to ``path``
    (appended); our own lines keep reaching the terminal. Restores everything on exit, also on errors."""
    global _terminal
    log = Path(path)
    log.parent.mkdir(parents=True, exist_ok=True)
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    term_out = os.fdopen(os.dup(saved[0]), "w", buffering=1, encoding="utf-8", errors="replace")
    term_err = os.fdopen(os.dup(saved[1]), "w", buffering=1, encoding="utf-8", errors="replace")
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    old_streams, old_terminal = (sys.stdout, sys.stderr), _terminal
    sys.stdout = _Router(term_out, old_streams[0])
    sys.stderr = _Router(term_err, old_streams[1])
    _terminal = term_err
    # Our own loggers' warnings are our messages: to the terminal (logging would write them from its own frames).
    ours = logging.StreamHandler(term_err)
    ours.setLevel(logging.WARNING)
    ours.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    loggers = [logging.getLogger(name) for name in sorted(OUR_PACKAGES - {"__main__", "rich", "click", "typer"})]
    old_propagate = [lg.propagate for lg in loggers]
    for lg in loggers:
        lg.addHandler(ours)
        lg.propagate = False
    try:
        yield log
    finally:
        for lg, prop in zip(loggers, old_propagate, strict=True):
            lg.removeHandler(ours)
            lg.propagate = prop
        for s in (sys.stdout, sys.stderr, *old_streams):
            with contextlib.suppress(Exception):
                s.flush()
        sys.stdout, sys.stderr = old_streams
        _terminal = old_terminal
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (*saved,):
            os.close(f)
        term_out.close()
        term_err.close()
