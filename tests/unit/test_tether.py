"""sao.core.tether: a tethered child dies with the process that started it when that process is SIGKILLed (also when
it was started from a thread that has ended), and its watcher does not outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sao.core import tether
from sao.core.tether import popen_tethered

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
WATCHER = tether.__file__.encode()  # the watcher runs this file as a script

# Starts a sleeping child from a worker thread that then ends (the case prctl(PR_SET_PDEATHSIG) gets wrong), prints
# its pid, and sleeps: the test SIGKILLs it.
LAUNCHER = """
import sys, threading, time
from sao.core import tether
from sao.core.tether import popen_tethered
out = []
t = threading.Thread(target=lambda: out.append(popen_tethered([sys.executable, "-c", "import time; time.sleep(120)"])))
t.start()
t.join()
print(out[0].pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody has reaped yet (PID 1 of a container may never reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _watchers(group: int) -> list[int]:
    """Pids of live watchers of ``group`` (their command line ends with ``group`` and the grace period)."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if WATCHER in args and args[-3:] == [str(group).encode(), b"10.0", b""] and not _gone(int(d.name)):
            found.append(int(d.name))
    return found


def _wait_until(cond: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def test_the_child_dies_with_its_sigkilled_starter_not_with_the_thread_that_started_it() -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert launcher.stdout is not None
        child = int(launcher.stdout.readline())
        assert _wait_until(lambda: _watchers(child), 5.0), "no watcher started"
        time.sleep(1.5)  # the starting thread has ended well before: the child must still run
        assert not _gone(child)
        launcher.kill()  # SIGKILL, and not reaped yet: the watcher must not take a zombie for a live starter
        assert _wait_until(lambda: _gone(child), 5.0), "the child outlived its starter"
        assert _wait_until(lambda: not _watchers(child), 5.0), "the watcher outlived the child"
    finally:
        launcher.kill()
        launcher.wait()


def test_a_child_stopped_by_its_starter_leaves_no_watcher_behind() -> None:
    proc = popen_tethered([sys.executable, "-c", "import time; time.sleep(120)"])
    assert _wait_until(lambda: _watchers(proc.pid), 5.0)
    os.killpg(proc.pid, signal.SIGTERM)  # the clean path stays the starter's: signal the group
    proc.wait(10)
    assert _wait_until(lambda: not _watchers(proc.pid), 5.0), "the watcher outlived the child"


# The group's leader and a child of it both ignore SIGTERM: only the escalation to SIGKILL ends them.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
child = subprocess.Popen([sys.executable, "-c", ignore])
print(child.pid, flush=True)
time.sleep(120)
"""


def test_stop_group_ends_every_member_even_those_that_ignore_sigterm() -> None:
    proc = popen_tethered([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    time.sleep(0.5)  # both have set their handlers
    t0 = time.monotonic()
    tether.stop_group(proc, timeout=1.0)
    assert proc.poll() == -signal.SIGKILL and time.monotonic() - t0 < 8
    assert _wait_until(lambda: _gone(child), 5.0), "a member of the group outlived stop_group"
    assert _wait_until(lambda: not _watchers(proc.pid), 5.0), "the watcher outlived the group"
