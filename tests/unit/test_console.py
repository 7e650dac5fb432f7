"""sao.core.console: the progress line fits 80 columns and gives an ETA; third-party output goes to the log while
our own lines (say, progress, the sao loggers' warnings) reach the terminal, decided by the way they are written
(never by who calls)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sao.core import console
from sao.core.console import MAX_WIDTH, ProgressLine


def test_progress_line_fits_80_columns_and_estimates_the_rest() -> None:
    buf = io.StringIO()
    line = ProgressLine("train", 10_000, stream=buf, every_s=0.0, status="waiting for the first batch")
    time.sleep(0.05)
    line.update(2_500, "reward 0.123 succ 0.45 lag 1.2 and a status far too long to fit on one line " * 2)
    eta = line.eta_s()
    assert eta is not None and 0.1 < eta < 1.0  # 3/4 left at the rate of the first quarter (~0.05 s)
    line.update(10_000)
    line.close()
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("train 0/10000 [----------]") and "<?" in lines[0]
    assert lines[1].startswith("train 2500/10000 [##--------]") and lines[1].endswith("~")
    assert lines[-1].startswith("train 10000/10000 [##########]")
    assert all(len(x) < MAX_WIDTH for x in lines)


def test_a_file_gets_one_line_per_interval_not_per_update() -> None:
    buf = io.StringIO()
    with ProgressLine("eval", 100, stream=buf, every_s=3600.0) as line:
        for _ in range(100):
            line.advance()
    assert [x.split(" [")[0] for x in buf.getvalue().splitlines()] == ["eval 0/100", "eval 100/100"]


SCRIPT = """
import os, sys, warnings
from sao.core.console import ProgressLine, say, third_party_to_log
with third_party_to_log(sys.argv[1]):
    print("a print, from anyone")
    import logging; logging.getLogger("sao.trainer.runs.run").warning("ours: a trainer warning")
    logging.getLogger("__main__").warning("ours: a script warning")
    say("ours: said")
    from rich.console import Console
    from sao.core.console import terminal
    Console(file=terminal()).print("ours: a rich line")
    logging.getLogger("somelib").info("somelib info")  # below the root's level: nowhere
    warnings.warn("a third-party style warning")
    import logging; logging.getLogger("somelib").warning("somelib warning")
    os.write(2, b"C-level stderr\\n")
    subprocess_out = __import__("subprocess").run(["echo", "child stdout"])
    from tqdm import tqdm
    for _ in tqdm(range(3), desc="Loading weights"): pass
    with ProgressLine("step", 2, every_s=0) as p:
        p.advance(); p.advance()
print("after: back to normal")
"""


def test_third_party_output_goes_to_the_log(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    log = tmp_path / "logs" / "third_party.log"
    env = dict(os.environ, PYTHONPATH=str(root))
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(log)], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    console = res.stdout + res.stderr
    for ours in (
        "ours: said",
        "ours: a rich line",
        "WARNING: ours: a trainer warning",
        "WARNING: ours: a script warning",
        "step 2/2 [##########]",
        "after: back to normal",
    ):
        assert ours in console
    text = log.read_text()
    for theirs in (
        "a print, from anyone",
        "third-party style warning",
        "WARNING somelib: somelib warning",
        "C-level stderr",
        "child stdout",
        "Loading weights",
    ):
        assert theirs in text and theirs not in console
    assert "ours:" not in text and "somelib info" not in text + console


def test_eta_text_for_log_lines() -> None:
    from sao.core.console import eta_text

    assert (
        eta_text(60.0, 2, 10) == "~4:00 left"
        and eta_text(3.0, 0, 5) == "? left"
        and eta_text(9.0, 3, 3) == "~0:00 left"
    )


def test_a_progress_line_on_a_pipe_repeats_itself_while_a_unit_takes_long(monkeypatch: pytest.MonkeyPatch) -> None:
    """A phase whose units take minutes (value pretraining's critic steps at load) must not go silent in a log:
    with no update the line is written again every HEARTBEAT_S, its clock moved on."""
    monkeypatch.setattr(console, "HEARTBEAT_S", 1.0)
    buf = io.StringIO()
    line = ProgressLine("value fit", 8, stream=buf, every_s=0.0, status="first step")
    time.sleep(3.5)  # no update at all: the first step has not finished
    line.close()
    lines = [x for x in buf.getvalue().splitlines() if x.startswith("value fit 0/8")]
    assert len(lines) >= 3, lines  # the first write, then >= 2 heartbeats (1 s apart, polled each second)
    assert lines[0].split()[4].startswith("0:00<") and lines[-2].split()[4] != lines[0].split()[4], lines
