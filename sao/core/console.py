"""What a person sees: our messages and one-line progress on the terminal, third-party output in a log file.

``third_party_to_log(path)`` sends everything written to the process's stdout and stderr file descriptors (progress
bars of transformers / datasets / huggingface_hub, DeepSpeed's warnings and op builds, C-level logs, child
processes, any ``print``) and every third-party log record to ``path``. Our output is ours by the way it is written,
never by who writes it: ``say(msg)`` prints one of our lines, ``ProgressLine`` is the one live progress display
(``label done/total [bar] elapsed<eta status`` in 80 columns, for anything a person waits for: training steps,
episodes, evals, SFT, image builds, setup, benches), ``terminal()`` is the stream for anything else of ours (a rich
``Console(file=terminal())``), and the ``sao`` loggers' warnings reach the terminal.

The line is ours rather than ``rich.progress``: it keeps a log file short (one line per ``every_s``, where rich's
live display writes nothing to a file until it stops), times its ETA by finer units than it counts (``set_work``:
turns of episodes in flight) and cuts to 80 columns; drawn in place it is one ``\r`` and an erase.
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
from typing import TextIO

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


#: On a pipe, the longest a live progress line stays silent.
HEARTBEAT_S = 30.0


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
        if enabled:  # the clock keeps ticking between updates: a long first step does not look hung
            threading.Thread(target=self._tick, name="sao-progress", daemon=True).start()

    def _tick(self) -> None:
        """On a terminal, redraw every second; on a pipe or file, write the line again when nothing was written for
        ``HEARTBEAT_S`` (a phase whose units take minutes still shows its clock moving in the log)."""
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception):
                if self.in_place:
                    self.redraw()
                elif self.enabled and time.monotonic() - self._last_write >= max(self.every_s, HEARTBEAT_S):
                    self._write(force=True)

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


#: Loggers whose records are our messages: their warnings reach the terminal while third-party output is logged.
OUR_LOGGERS = ("sao", "__main__")


@contextlib.contextmanager
def third_party_to_log(path: str | Path) -> Iterator[Path]:
    """Send third-party output to ``path`` (appended) while ours keeps reaching the terminal; restores everything on
    exit, also on errors. Nothing is decided by who is calling. File descriptors 1 and 2 go to the log: C-level
    output, child processes, and Python's ``sys.stdout`` / ``sys.stderr`` (``print``, tqdm bars). Log records go by
    logger name: warnings of ``OUR_LOGGERS`` to the terminal; the rest, and ``warnings.warn`` (captured), to the log.
    Our own lines take the explicit way: ``say``, ``ProgressLine``, or ``terminal()`` as a stream."""
    global _terminal
    log = Path(path)
    log.parent.mkdir(parents=True, exist_ok=True)
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    term = os.fdopen(os.dup(saved[1]), "w", buffering=1, encoding="utf-8", errors="replace")
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    old_terminal, _terminal = _terminal, term
    try:
        with _records_by_logger(term, log):
            yield log
    finally:
        for s in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                s.flush()
        _terminal = old_terminal
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in saved:
            os.close(f)
        term.close()


@contextlib.contextmanager
def _records_by_logger(term: TextIO, log: Path) -> Iterator[None]:
    """Warnings of our loggers to ``term`` ("WARNING: ..."); every other record reaching the root logger, and the
    ``warnings`` module's (``logging.captureWarnings``), to ``log`` with a time and the logger's name."""
    ours = logging.StreamHandler(term)
    ours.setLevel(logging.WARNING)
    ours.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    theirs = logging.FileHandler(log, encoding="utf-8")
    theirs.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [logging.getLogger(name) for name in OUR_LOGGERS]
    old_propagate = [lg.propagate for lg in loggers]
    for lg in loggers:
        lg.addHandler(ours)
        lg.propagate = False
    root = logging.getLogger()
    root.addHandler(theirs)
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        root.removeHandler(theirs)
        theirs.close()
        for lg, prop in zip(loggers, old_propagate, strict=True):
            lg.removeHandler(ours)
            lg.propagate = prop
